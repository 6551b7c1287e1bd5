"""Run configs for Cloud TPU slices (v4, v5p): real model sizes, checked by the TPU compiler
(scripts/plan.py --compile tpu) and launched with scripts/launch.py tpu or gke."""
