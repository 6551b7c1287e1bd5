"""The training loop: optimizer, jitted steps, FLOPs/MFU, trackers, train_and_evaluate."""

from training.loop import train_and_evaluate
from training.validate import ConfigError, validate_config

__all__ = ["ConfigError", "train_and_evaluate", "validate_config"]
