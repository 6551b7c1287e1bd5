"""The fields that were renamed or moved (an old config file, command line or checkpoint record
names them), and their one-line errors (ConfigError, the one-line error of any bad config, flag or
config-dependent input)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user error in the config or flags; train.py prints it as one line and exits 2."""


# Fields that were renamed: an old config file or command line gets the new name in its error.
RENAMED_FIELDS = {"parallel.attention": "parallel.layout"}
# Fields whose setting moved into another one: the error names it and shows its values.
MOVED_FIELDS = {"model.tile_q": ("parallel.tile", "512, '256x128' (query x key) or 'auto'"),
                "model.tile_k": ("parallel.tile", "512, '256x128' (query x key) or 'auto'")}


def moved_field_error(old: str, flag: bool = False) -> str | None:
    """The one line for a renamed or moved field `old` ('model.tile_q'), as a config file
    (flag False) or a --config flag names it; None for a field that did not move."""
    if old in RENAMED_FIELDS:
        new = RENAMED_FIELDS[old]
        return (f"--config.{old} was renamed: use --config.{new}" if flag else
                f"config field {old} was renamed {new}: rename it in the config file "
                f"(config.{new} = ...)")
    if old in MOVED_FIELDS:
        new, values = MOVED_FIELDS[old]
        return (f"--config.{old} moved into {new}: use --config.{new}=VALUE ({values})" if flag
                else f"config field {old} moved into {new}: set config.{new} in the config "
                     f"file ({values})")
    return None


def check_renamed(values: dict) -> None:
    """ConfigError for the first renamed or moved field that a config's values still set."""
    for old in (*RENAMED_FIELDS, *MOVED_FIELDS):
        section, field = old.split(".")
        if field in (values.get(section) or {}):
            raise ConfigError(moved_field_error(old))
