"""Launching train.py through the engines that schedule clusters: SLURM (`slurm.py`), Cloud TPU
queued resources (`tpu.py`), GKE JobSets (`gke.py`), each an Engine (`engine.py`) registered in
`engines.py` (ENGINES), of which scripts/launch.py makes one subcommand each. Beside them: a TPU
VM slice by hand (`tpu_vm.py`, scripts/tpu_pod.py) and N local processes joined by
jax.distributed (`local.py`, scripts/launch_local.py).

Every engine runs the same check before anything is paid for (`preflight.py`: the TPU compiler
for a TPU slice, the planner's memory check for GPUs) and gives a run the same preemption rule:
train.py saves at the step the notice (SIGTERM, the runtime's preemption notice) arrives and
exits 75 (checkpoints.PREEMPTED_EXIT_CODE); the engine starts it again, and it resumes from that
checkpoint exactly. Exit 0 is "finished"; any other code is a failure no engine retries forever.

It starts no JAX but for the check, in the launcher's own process (skipped with --skip-check,
or printed only with --dry-run): a login node, or a laptop with gcloud or kubectl, runs it.
"""
