"""What a run's compiled program does, read without running it for long: the train step compiled
ahead of time and XLA's memory figures (aot.py, the planner's second opinion and the
launchers' check), whether a compiled loop hides its transfers (hlo_overlap.py), a step split
into attention tiles and the rest (step_split.py), and a profile of config.profile's steps
(profile.py)."""
