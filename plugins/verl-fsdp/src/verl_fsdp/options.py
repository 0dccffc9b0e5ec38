"""Options of the ``fsdp`` training engine: ``actor_rollout_ref.actor.engine_kwargs.fsdp``.

Keys follow verl's ``actor_rollout_ref.actor.fsdp_config`` (``verl/workers/config/engine.py:FSDPEngineConfig``)
restricted to what FSDP2 uses here; an unknown key is a config error naming it. Only attrs and the
standard library are imported, so listing plugins stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

_DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


def _dtype_or_none(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and str(value).lower() not in _DTYPES:
        raise ValueError(
            f"engine_kwargs.fsdp.mixed_precision.{attribute.name}={value!r} is not one of {list(_DTYPES)} or null"
        )


@attrs.frozen(kw_only=True)
class MixedPrecisionOptions:
    """FSDP2 mixed precision (``fsdp_config.mixed_precision``); ``None`` everywhere = no mixed precision.

    Attributes:
        param_dtype: dtype the all-gathered parameters are cast to for forward/backward
            (``MixedPrecisionPolicy.param_dtype``); sharded master weights keep ``model_dtype``.
        reduce_dtype: dtype of the gradient reduce-scatter (``MixedPrecisionPolicy.reduce_dtype``).
        buffer_dtype: accepted for verl compatibility (an FSDP1 knob); FSDP2 leaves buffers in
            ``model_dtype``, which is logged once when it is set.
    """

    param_dtype: str | None = attrs.field(default=None, validator=_dtype_or_none)
    reduce_dtype: str | None = attrs.field(default=None, validator=_dtype_or_none)
    buffer_dtype: str | None = attrs.field(default=None, validator=_dtype_or_none)

    @property
    def enabled(self) -> bool:
        """True when any dtype is set."""
        return any(v is not None for v in (self.param_dtype, self.reduce_dtype, self.buffer_dtype))


def _mixed_precision(value: Any) -> Any:
    if value is None:
        return MixedPrecisionOptions()
    if isinstance(value, Mapping):
        return MixedPrecisionOptions(**dict(value))
    return value


def _fsdp_size(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (value != -1 and value < 1):
        raise ValueError(f"engine_kwargs.fsdp.fsdp_size must be -1 (all ranks) or an int >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class FSDPEngineOptions:
    """Options of the ``fsdp`` engine, read from ``actor_rollout_ref.actor.engine_kwargs.fsdp``.

    Attributes:
        param_offload: keep sharded parameters, gradients and the optimizer step on the CPU
            (FSDP2 ``CPUOffloadPolicy``); meaningless on ``cpu`` (logged once, ignored).
        optimizer_offload: move the optimizer state to the CPU between training steps (verl's
            ``optimizer_offload``); meaningless on ``cpu`` (logged once, ignored).
        reshard_after_forward: free the gathered parameters after forward (ZeRO-3) instead of
            keeping them until backward (ZeRO-2 memory, less communication).
        model_dtype: dtype of the sharded (master) parameters; ``float32`` like verl's actor.
        mixed_precision: :class:`MixedPrecisionOptions` (a mapping in YAML).
        fsdp_size: ranks one parameter is sharded over; ``-1`` = all ranks (plain FSDP), else
            hybrid sharding (HSDP) over a ``(world_size // fsdp_size, fsdp_size)`` mesh
            ``("ddp", "fsdp")``: replicate across groups, shard inside a group, like verl.
    """

    param_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    optimizer_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    reshard_after_forward: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    model_dtype: str = attrs.field(default="float32", validator=attrs.validators.in_(_DTYPES))
    mixed_precision: MixedPrecisionOptions = attrs.field(factory=MixedPrecisionOptions, converter=_mixed_precision)
    fsdp_size: int = attrs.field(default=-1, validator=_fsdp_size)


def read_options(config: Any, role: str = "actor") -> FSDPEngineOptions:
    """Build :class:`FSDPEngineOptions` from a root config (verl's ``fsdp_config`` keys).

    ``actor``: ``actor_rollout_ref.actor.engine_kwargs.fsdp`` (= ``actor.fsdp_config``). ``ref``: the
    actor's options, overridden key by key by ``actor_rollout_ref.ref.engine_kwargs.fsdp``
    (= ``ref.fsdp_config``, e.g. ``param_offload: true`` for the frozen reference policy only).

    Raises:
        TypeError: an unknown key (the config loader reports it earlier as a ``ConfigError``).
        ValueError: a value out of range (message names the key).
    """
    raw = config.actor_rollout_ref.actor.engine_kwargs.get("fsdp", {}) or {}
    if isinstance(raw, FSDPEngineOptions):
        raw = attrs.asdict(raw, recurse=False)
    merged = dict(raw)
    if role == "ref":
        ref_kwargs = getattr(config.actor_rollout_ref.ref, "engine_kwargs", {}) or {}
        override = ref_kwargs.get("fsdp", {}) or {}
        if isinstance(override, FSDPEngineOptions):
            override = attrs.asdict(override, recurse=False)
        merged.update(dict(override))
    return FSDPEngineOptions(**merged)
