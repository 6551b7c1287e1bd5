"""The planner's offline reports, beside what every run resolves (the package above): the whole
analytic plan (plan.py) and its text (text.py, time_text.py: what scripts/plan.py prints), what
dominates memory and the model-size table (sizes.py), windowed attention per layout and
strategy (windows.py)."""
