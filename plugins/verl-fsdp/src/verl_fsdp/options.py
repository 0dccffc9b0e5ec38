"""Options of the ``fsdp`` training engine: ``actor_rollout_ref.actor.engine_kwargs.fsdp``.

Config load structures them per role (:func:`verl.config.role_options`: the reference policy's
``ref.engine_kwargs.fsdp`` over the actor's, the critic's ``critic.engine_kwargs.fsdp`` alone) and the worker
hands the instance to :func:`verl_fsdp.builder.build_fsdp_training_engine` as ``options``.

Keys follow verl's ``actor_rollout_ref.actor.fsdp_config`` (``verl/workers/config/engine.py:FSDPEngineConfig``)
restricted to what FSDP2 uses here; an unknown key is a config error naming it. Only attrs and the
standard library are imported, so listing plugins stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

_DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
AUTO = "auto"
# verl's FSDP defaults on accelerators (verl/workers/engine/fsdp/transformer_impl.py: bf16 params, fp32 reduce).
ACCELERATOR_DEFAULTS = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}


def _dtype_or_none(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and str(value).lower() not in (*_DTYPES, AUTO):
        raise ValueError(
            f"engine_kwargs.fsdp.mixed_precision.{attribute.name}={value!r} is not one of {[*_DTYPES, AUTO]} or null"
        )


@attrs.frozen(kw_only=True)
class MixedPrecisionOptions:
    """FSDP2 mixed precision (``fsdp_config.mixed_precision``).

    ``auto`` (the default) is verl's choice on accelerators (bf16 parameters, fp32 gradient reduction) and no
    mixed precision on the CPU (bf16 matmuls are several times slower there); ``null`` turns a dtype off
    everywhere.

    Attributes:
        param_dtype: dtype the all-gathered parameters are cast to for forward/backward
            (``MixedPrecisionPolicy.param_dtype``); sharded master weights keep ``model_dtype``.
        reduce_dtype: dtype of the gradient reduce-scatter (``MixedPrecisionPolicy.reduce_dtype``).
        buffer_dtype: accepted for verl compatibility (an FSDP1 knob); FSDP2 leaves buffers in
            ``model_dtype``, which is logged once when it is set.
    """

    param_dtype: str | None = attrs.field(default=AUTO, validator=_dtype_or_none)
    reduce_dtype: str | None = attrs.field(default=AUTO, validator=_dtype_or_none)
    buffer_dtype: str | None = attrs.field(default=None, validator=_dtype_or_none)

    def resolved(self, device_type: str) -> dict[str, str | None]:
        """``{"param_dtype", "reduce_dtype"}`` on ``device_type`` with ``auto`` resolved (None = off)."""
        out: dict[str, str | None] = {}
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value == AUTO:
                value = None if device_type == "cpu" else ACCELERATOR_DEFAULTS[name]
            out[name] = value
        return out


def _mixed_precision(value: Any) -> Any:
    if value is None:
        return MixedPrecisionOptions()
    if isinstance(value, Mapping):
        return MixedPrecisionOptions(**dict(value))
    return value


def _orig_params(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not True:
        raise ValueError(
            f"engine_kwargs.fsdp.use_orig_params={value!r}: this engine is FSDP2 (fully_shard), which always keeps "
            "the original parameters (one DTensor shard each), i.e. behaves as use_orig_params=true; flat parameters "
            "(false) exist in FSDP1 only, and verl's FSDP2 path ignores the key. Remove it or set it to true"
        )


def _ulysses(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value == 1 and not isinstance(value, bool):
        return
    raise ValueError(
        f"engine_kwargs.fsdp.ulysses_sequence_parallel_size={value!r} (verl's fsdp_config."
        "ulysses_sequence_parallel_size): Ulysses sequence parallelism (each sequence split over this many ranks, "
        "attention heads exchanged by all-to-all) is not built in this engine; only 1 (no sequence parallelism) "
        "is accepted: set it to 1 or remove it"
    )


def _turbo_config(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None or value == {}:
        return
    raise ValueError(
        f"engine_kwargs.fsdp.turbo_config={value!r}: verl reads turbo_config only in its fsdp_turbo engine "
        "(strategy=fsdp_turbo, the fsdp_turbo library's FSDPTurbo wrapper), which is not built here; verl's "
        "FSDP2 engine ignores it, so under strategy=fsdp it would do nothing. Remove it"
    )


def _optional(kind: type) -> Any:
    def check(inst: object, attribute: attrs.Attribute, value: object) -> None:
        bad = value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool)))
        if bad or (kind is int and value is not None and value < 1):
            what = "true, false" if kind is bool else "an int >= 1"
            raise ValueError(f"engine_kwargs.fsdp.{attribute.name} must be {what} or null, got {value!r}")

    return check


def _fsdp_size(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (value != -1 and value < 1):
        raise ValueError(f"engine_kwargs.fsdp.fsdp_size must be -1 (all ranks) or an int >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class FSDPEngineOptions:
    """Options of the ``fsdp`` engine, read from ``actor_rollout_ref.actor.engine_kwargs.fsdp``.

    Attributes:
        param_offload: move the sharded parameters to host memory while the rollout generates and back before
            the next forward (verl's FSDP2 ``param_offload``: ``offload_fsdp_model_to_cpu``); meaningless on
            ``cpu`` (logged once; nothing moves).
        optimizer_offload: the same for the optimizer state (verl's ``optimizer_offload``).
        offload_policy: keep parameters, gradients and the optimizer step on the host for good, streamed to
            the device layer by layer (FSDP2 ``CPUOffloadPolicy``, verl's ``offload_policy``); replaces the two
            options above. Meaningless on ``cpu``.
        reshard_after_forward: free the gathered parameters after forward (ZeRO-3) instead of
            keeping them until backward (ZeRO-2 memory, less communication): FSDP2's
            ``fully_shard(reshard_after_forward=...)`` on every decoder layer and the root, as verl's
            ``apply_fsdp2``. FSDP2 never reshards the root after forward (its parameters are needed first in
            backward), so ``true`` shows on the layers.
        forward_prefetch: FSDP2 explicit forward prefetching: each decoder layer starts the all-gather of the
            next one before its own forward runs (``FSDPModule.set_modules_to_forward_prefetch([next])``, depth
            1), as verl's ``apply_fsdp2`` maps the key (FSDP1's ``forward_prefetch_limit=1``). Same values,
            more overlap of communication and compute; for models whose layer order does not change.
        model_dtype: dtype of the sharded (master) parameters; ``float32`` like verl's actor.
        mixed_precision: :class:`MixedPrecisionOptions` (a mapping in YAML).
        fsdp_size: ranks one parameter is sharded over; ``-1`` = all ranks (plain FSDP), else
            hybrid sharding (HSDP) over a ``(world_size // fsdp_size, fsdp_size)`` mesh
            ``("ddp", "fsdp")``: replicate across groups, shard inside a group, like verl.
        use_torch_compile / entropy_from_logits_with_chunking / entropy_from_logits_chunk_size /
            entropy_checkpointing: verl's engine-level copies of the actor/ref keys of the same name (verl's engine
            reads ``fsdp_config.<key>``, which its YAML fills from the role's key); ``null`` = the role's key, a
            value set here wins for this engine.
        use_orig_params: verl's FSDP1 switch between flat and original parameters. FSDP2 always keeps the
            original parameters, so only ``true`` (what it does) is accepted; ``false`` is refused with that reason
            (verl's own FSDP2 path ignores the key; its default ``false`` describes FSDP1).
        ulysses_sequence_parallel_size: verl's Ulysses sequence-parallel degree. Not built: ``1`` (verl's
            default, no sequence parallelism) is accepted, any other value is refused with that reason.
        turbo_config: options of verl's ``fsdp_turbo`` engine, which this plugin does not provide; verl's FSDP2
            engine ignores them, so only null or ``{}`` is accepted and anything else is refused with the reason.
    """

    param_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    optimizer_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    offload_policy: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    reshard_after_forward: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    forward_prefetch: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    model_dtype: str = attrs.field(default="float32", validator=attrs.validators.in_(_DTYPES))
    mixed_precision: MixedPrecisionOptions = attrs.field(factory=MixedPrecisionOptions, converter=_mixed_precision)
    fsdp_size: int = attrs.field(default=-1, validator=_fsdp_size)
    use_orig_params: bool = attrs.field(default=True, validator=_orig_params)
    use_torch_compile: bool | None = attrs.field(default=None, validator=_optional(bool))
    entropy_from_logits_with_chunking: bool | None = attrs.field(default=None, validator=_optional(bool))
    entropy_from_logits_chunk_size: int | None = attrs.field(default=None, validator=_optional(int))
    entropy_checkpointing: bool | None = attrs.field(default=None, validator=_optional(bool))
    ulysses_sequence_parallel_size: int = attrs.field(default=1, validator=_ulysses)
    turbo_config: dict[str, Any] | None = attrs.field(default=None, validator=_turbo_config)

    def token_stats_overrides(self) -> dict[str, Any]:
        """The :class:`~verl.engines.reference.training.EngineSettings` fields set here (``null`` ones left out)."""
        names = (
            "use_torch_compile",
            "entropy_from_logits_with_chunking",
            "entropy_from_logits_chunk_size",
            "entropy_checkpointing",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}
