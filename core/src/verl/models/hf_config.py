"""The HF model config as verl builds it: ``from_pretrained`` then ``model.override_config`` on top.

verl (``verl/workers/config/model.py:HFModelConfig`` and ``verl/workers/fsdp_workers.py``) loads the config
with ``trust_remote_code``, takes ``attn_implementation`` from ``override_config`` at load time, unwraps a
``model_config`` sub-dict (Megatron's spelling), and applies the rest with ``update_model_config``
(``verl/utils/model.py``: ``setattr`` per key, recursing into dict values), all before the weights are
loaded, so an override such as ``attention_dropout`` or ``rope_scaling`` shapes the model that is built.

Deviation from verl: a key the config does not have is refused (verl's ``setattr`` would add it silently,
and a misspelt key would then change nothing).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

# Read by from_pretrained itself, not an attribute to set afterwards (verl passes it the same way).
_LOAD_TIME_KEYS = ("attn_implementation",)
_MISSING = object()


def split_override_config(override_config: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(load-time kwargs, attribute overrides)`` of a ``model.override_config`` mapping.

    A ``model_config`` sub-dict (verl's Megatron spelling) is unwrapped; ``attn_implementation`` goes to
    ``from_pretrained``.

    Raises:
        TypeError: ``override_config`` (or its ``model_config``) is not a mapping.
    """
    if override_config is None:
        return {}, {}
    if not isinstance(override_config, Mapping):
        raise TypeError(f"model.override_config must be a mapping of HF config keys, got {type(override_config)}")
    overrides = dict(override_config)
    if "model_config" in overrides:
        inner = overrides.pop("model_config")
        if not isinstance(inner, Mapping):
            raise TypeError(f"model.override_config.model_config must be a mapping, got {type(inner)}")
        overrides.update(inner)
    load_kwargs = {k: overrides.pop(k) for k in _LOAD_TIME_KEYS if k in overrides}
    return load_kwargs, overrides


def apply_override_config(hf_config: Any, overrides: Mapping[str, Any], *, field: str) -> Any:
    """Set ``overrides`` on ``hf_config`` in place (nested dicts recurse into sub-configs); returns it.

    Args:
        hf_config: a ``transformers.PretrainedConfig`` (or a sub-config).
        overrides: key -> value; a dict value updates a sub-config (``text_config``) key by key and replaces
            a dict-valued key (``rope_scaling``) whole.
        field: the config key being applied (``actor_rollout_ref.model.override_config``), for messages.

    Raises:
        ValueError: a key the config does not have (the message names ``field.<key>`` and close spellings).
    """
    for key, value in overrides.items():
        current = getattr(hf_config, key, _MISSING)
        if current is _MISSING:
            close = difflib.get_close_matches(str(key), list(hf_config.to_dict()), n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(
                f"{field}.{key}: the model config ({type(hf_config).__name__}) has no key {key!r}, so the "
                f"override would change nothing.{hint} Check the model's config.json for the key names."
            )
        if isinstance(value, Mapping) and hasattr(current, "to_dict"):  # a sub-config (e.g. text_config)
            apply_override_config(current, value, field=f"{field}.{key}")
        else:  # plain values and dict-valued keys (rope_scaling) are replaced whole
            setattr(hf_config, key, dict(value) if isinstance(value, Mapping) else value)
    return hf_config


def load_hf_config(
    path: str | os.PathLike[str],
    *,
    trust_remote_code: bool = False,
    override_config: Mapping[str, Any] | None = None,
    field: str = "actor_rollout_ref.model.override_config",
    **kwargs: Any,
) -> Any:
    """``AutoConfig.from_pretrained(path, trust_remote_code=..., **kwargs)`` with ``override_config`` applied.

    Args:
        path: HF folder or hub id.
        trust_remote_code: verl's ``model.trust_remote_code`` (run the repository's configuration code).
        override_config: verl's ``model.override_config``; ``None``/empty changes nothing.
        field: the config key of ``override_config``, named in errors.
        kwargs: more ``from_pretrained`` kwargs (e.g. ``num_labels=1`` for a value model).

    Returns:
        the ``PretrainedConfig`` to pass to ``from_pretrained(path, config=...)``.

    Raises:
        ValueError / TypeError: as :func:`apply_override_config` and :func:`split_override_config`.
    """
    from transformers import AutoConfig

    load_kwargs, overrides = split_override_config(override_config)
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code, **load_kwargs, **kwargs)
    return apply_override_config(config, overrides, field=field)
