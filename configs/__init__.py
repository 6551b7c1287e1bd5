"""Run configs (one get_config() per file; configs/default.py is the embedded default), and
`setting`: a config's field, or the default config's value where a config lacks it."""

import functools


@functools.cache
def _defaults():
    from configs import default
    return default.get_config()


def setting(config, name: str):
    """`config`'s field `name` ('optim.max_skipped_steps'), or configs/default.py's where the
    config lacks it (a user's own config, one saved before the field existed): the one home of
    every default, which no reader restates."""
    node, fallback = config, _defaults()
    *sections, field = name.split(".")
    for section in sections:
        node = node.get(section) if hasattr(node, "get") else None
        fallback = fallback[section]
    return node[field] if hasattr(node, "get") and field in node else fallback[field]
