"""The training loop: optimizer, jitted steps, FLOPs/MFU, trackers, train_and_evaluate."""

from training.loop import NonFiniteError, train_and_evaluate
from training.validate import ConfigError, validate_config

__all__ = ["ConfigError", "NonFiniteError", "train_and_evaluate", "validate_config"]
