"""Run configs for GPU nodes (A100, H100): real model sizes, launched with
scripts/launch.py slurm."""
