"""The run config, typed: a frozen RunConfig built once from a config file's ConfigDict (and
the command line, a stage, init_from), read by every package below the entry points.

    from run_config import build
    config = build(configs.tiny.get_config())
    config.model.d_model, config.data.source, config.parallel.tiles, config.tokens_per_step

run_config/schema.py: every field's type, default and comment, declared once;
run_config/build.py: build, replace, to_dict; run_config/config_dict.py: the ConfigDict a config
file starts from (configs/default.py); run_config/errors.py: ConfigError and the renamed fields.
"""

from run_config.build import (build, defaults, field_value, has_field, plain, replace,
                               to_dict, typed)
from run_config.config_dict import default_config
from run_config.errors import (MOVED_FIELDS, RENAMED_FIELDS, ConfigError, check_renamed,
                               moved_field_error)
from run_config.schema import (DataConfig, MeshConfig, OptimConfig, ParallelConfig,
                               RunConfig)

__all__ = ["MOVED_FIELDS", "RENAMED_FIELDS", "ConfigError", "DataConfig", "MeshConfig",
           "OptimConfig", "ParallelConfig", "RunConfig", "build", "check_renamed",
           "default_config", "defaults", "field_value", "has_field", "moved_field_error",
           "plain", "replace", "to_dict", "typed"]
