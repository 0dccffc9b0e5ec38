"""``actor_rollout_ref.model.{trust_remote_code, override_config}`` for the model vLLM loads itself.

verl passes ``model.trust_remote_code`` to vLLM (``vllm_async_server.py``: ``trust_remote_code=...``); this
plugin passes it the same way, to the tokenizer and the HF-config loads too. ``override_config`` goes to
vLLM's ``hf_overrides`` (``vllm.engine.arg_utils.EngineArgs.hf_overrides``: a dict of HF config keys, a dict
value updating a sub-config key by key, else set whole), the same semantics as the actor's
:func:`verl.models.hf_config.apply_override_config`, so actor and rollout build one architecture.

Deviation from verl: verl's vLLM server sends only its quantization settings as ``hf_overrides`` (the rollout
then ignores ``override_config``, and e.g. a ``rope_scaling`` override makes actor and rollout differ). Here
the override is checked against the model config first (an unknown key is refused naming
``actor_rollout_ref.model.override_config.<key>``); ``attn_implementation``, a ``from_pretrained`` argument
for HF's attention, is not sent (vLLM picks its own attention backend).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["hf_overrides", "load_model_config", "trust_remote_code"]


def trust_remote_code(model_config: Any) -> bool:
    """``model_config.trust_remote_code`` (False when ``model_config`` is None or lacks it)."""
    return bool(getattr(model_config, "trust_remote_code", False))


def _override_config(model_config: Any) -> Mapping[str, Any] | None:
    return getattr(model_config, "override_config", None)


def load_model_config(model_path: Any, model_config: Any) -> Any:
    """The HF ``PretrainedConfig`` of ``model_path`` with ``model_config.override_config`` applied.

    Args:
        model_path: resolved HF model folder.
        model_config: the ``actor_rollout_ref.model`` section (``trust_remote_code``, ``override_config``), or
            None for the saved config.

    Raises:
        ValueError / TypeError: an override key the config lacks, or a non-mapping override
            (:func:`verl.models.hf_config.load_hf_config`).
    """
    from verl.models.hf_config import load_hf_config

    return load_hf_config(
        str(model_path),
        trust_remote_code=trust_remote_code(model_config),
        override_config=_override_config(model_config),
    )


def _plain(value: Any) -> Any:
    # vLLM tells sub-config updates from plain values with isinstance(value, dict).
    return {str(k): _plain(v) for k, v in value.items()} if isinstance(value, Mapping) else value


def hf_overrides(model_config: Any) -> dict[str, Any]:
    """``vllm.LLM(hf_overrides=...)`` for ``model_config.override_config``: ``{}`` when there is none.

    A ``model_config`` sub-dict (verl's Megatron spelling) is unwrapped and ``attn_implementation`` left out,
    as the actor's load does (:func:`verl.models.hf_config.split_override_config`).

    Raises:
        TypeError: ``override_config`` is not a mapping.
    """
    from verl.models.hf_config import split_override_config

    _load_time, overrides = split_override_config(_override_config(model_config))
    return {str(key): _plain(value) for key, value in overrides.items()}
