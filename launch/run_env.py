"""What a run takes from the shell that launches it: wandb's variables, forwarded by every
engine to where train.py really runs (a SLURM job, each TPU VM, each GKE pod), so that
`WANDB_MODE=online WANDB_PROJECT=p python scripts/launch.py ...` logs where it says.

    forwarded({"WANDB_PROJECT": "p", "WANDB_API_KEY": "k", "HOME": "/h"})
    -> {"WANDB_PROJECT": "p", "WANDB_API_KEY": "k"}
    hide_secrets("... WANDB_API_KEY=k ...", {"WANDB_API_KEY": "k"}) -> "... WANDB_API_KEY=*** ..."

The API key is never printed: every command a launcher echoes goes through hide_secrets, and
no file the launchers write holds it (SLURM's job gets it from sbatch's environment, a TPU VM
in a file only its user reads, a GKE pod from a Kubernetes secret).
"""

from __future__ import annotations

import os

FORWARDED = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY")
SECRETS = ("WANDB_API_KEY",)
HIDDEN = "***"


def forwarded(environ=None) -> dict[str, str]:
    """The forwarded variables set (non-empty) in `environ` (default: this process's)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in FORWARDED if environ.get(name)}


def public(env: dict[str, str]) -> dict[str, str]:
    """`env` without its secrets: what may be written into a script or a manifest."""
    return {k: v for k, v in env.items() if k not in SECRETS}


def hide_secrets(text: str, env: dict[str, str] | None = None) -> str:
    """`text` with the value of every secret in `env` (default: this process's) replaced."""
    env = forwarded() if env is None else env
    for name in SECRETS:
        if env.get(name):
            text = text.replace(env[name], HIDDEN)
    return text
