"""Read verl-style config values from any object: attrs/dataclass instances, SimpleNamespace, dicts, None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cfg_get(config: Any, name: str, default: Any = None) -> Any:
    """``config.name`` (or ``config[name]``); ``default`` when config is None, lacks it, or holds None.

    None counts as "unset" because verl's config uses None for "inherit" (e.g. clip_ratio_low -> clip_ratio).
    """
    if config is None:
        return default
    value = config.get(name, None) if isinstance(config, Mapping) else getattr(config, name, None)
    return default if value is None else value
