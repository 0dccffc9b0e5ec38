"""Colocated weight sync (the hybrid engine's): trainer -> rollout engines living in the same processes.

Source of the design: verl ``ActorRolloutRefWorker.update_weights`` (``mode="naive"``, anatomy §6.3): export
``(name, tensor)`` pairs from the training engine and feed them to ``rollout.update_weights``. No disk, no
serialisation. Four cases:

* **shared module** (the reference trainer and the ``hf`` rollout hold the very same ``nn.Module``): the
  optimizer already updated the rollout's weights; nothing moves;
* **one process, own copy**: the trainer's tensors are handed over and copied in place;
* **LoRA served as an adapter** (a rollout built with ``serves_lora_adapters``, e.g. vLLM): only the adapter
  tensors move (:meth:`ColocatedCheckpointEngine._sync_adapter`); the rollout keeps the frozen base it loaded;
* **a world of ranks** (FSDP trainer, rollout replicas of ``tensor_model_parallel_size`` ranks): the rollout
  says which slice every rank holds (``rollout.weight_layout()``) and the trainer reshards its shards into
  exactly those slices, bucket by bucket (:mod:`verl.engines.weight_sync.reshard`): no rank gathers a tensor
  it does not hold whole in the rollout.

Before anything is written, the names and shapes the update will carry are checked by the rollout
(``rollout.check_weights``) on every rank, and the ranks agree on the outcome: a bad update is refused
everywhere and the rollout keeps its weights.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import attrs
import torch

from verl.engines.weight_sync.buckets import ALIGN, bucket_capacity_bytes

# Engines expose their live module under different names (``model`` here, ``module`` in some plugins).
_MODULE_ATTRS = ("model", "module")


class WeightCheckError(ValueError):
    """The rollout refused an update before anything was written (on this or another rank)."""


@attrs.frozen(kw_only=True)
class ColocatedOptions:
    """Options of the ``colocated`` checkpoint engine (``checkpoint_engine.engine_kwargs.colocated``).

    Attributes:
        bucket_bytes: exact cap, in bytes, of one resharding bucket (send + receive bytes on any rank);
            overrides ``update_weights_bucket_megabytes`` (whole MiB) when set, for small models and tests.
    """

    bucket_bytes: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(ALIGN))
    )


def _live_module(engine: Any) -> torch.nn.Module | None:
    for attr in _MODULE_ATTRS:
        module = getattr(engine, attr, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def serves_adapter(trainer: Any, rollout: Any) -> bool:
    """True when the trainer trains LoRA and the rollout was built to serve it as an adapter (vLLM ``LoRARequest``,
    ``actor_rollout_ref.model.lora.merge`` not true): the sync sends the adapter, not merged weights."""
    return bool(getattr(trainer, "lora", False)) and bool(getattr(rollout, "serves_lora_adapters", False))


def shares_module(trainer: Any, rollout: Any) -> bool:
    """True when trainer and rollout hold the very same ``nn.Module`` object (no copy)."""
    a, b = _live_module(trainer), _live_module(rollout)
    return a is not None and a is b


class ColocatedCheckpointEngine:
    """Weight sync for a trainer and a rollout engine living in the same process (``colocated``).

    Sharing is safe when both hold one module because

    * the reference rollout never casts, moves or offloads a module it was given (its ``dtype`` setting does
      not apply: generation runs in the trainer's dtype, float32 on CPU), so the trainer's master weights
      are never rounded to bfloat16 behind the optimizer's back;
    * generation runs under ``torch.no_grad`` in eval mode and restores the module's train/eval flag;
    * trainer and rollout run one after the other in one process, so generation never sees a half-applied
      optimizer step.

    Sharing is *not* possible when the rollout must run in another dtype or device, or when the trainer's
    parameters are sharded (FSDP/DTensor): then the rollout owns a copy (or a TP shard) and this engine
    reshards into it.

    Args:
        config: the ``checkpoint_engine`` section (``update_weights_bucket_megabytes``); None for defaults.
        options: :class:`ColocatedOptions`, validated at config load (``engine_kwargs.colocated``); None for
            defaults. The section's ``engine_kwargs`` are never read here.

    Raises:
        TypeError: ``options`` is not a :class:`ColocatedOptions`.
    """

    def __init__(self, config: Any = None, *, options: ColocatedOptions | None = None) -> None:
        if options is not None and not isinstance(options, ColocatedOptions):
            raise TypeError(
                f"colocated checkpoint engine: options must be a ColocatedOptions (verl.config.role_options) or "
                f"None, got {type(options).__name__}"
            )
        self.config = config
        self.options = options if options is not None else ColocatedOptions()
        megabytes = getattr(config, "update_weights_bucket_megabytes", None) or 2048
        self.bucket_bytes = self.options.bucket_bytes or bucket_capacity_bytes(megabytes)

    def sync(self, trainer: Any, rollout: Any) -> dict[str, Any]:
        """Push the trainer's current weights into ``rollout`` (collective over the world when it has a layout).

        Returns:
            ``{"tensors", "bytes", "seconds", "shared"}`` (``bytes``: tensors handed to the rollout, numel x
            element size) plus, for a resharded sync, ``sent_bytes``, ``received_bytes``, ``buckets``,
            ``peak_buffer_bytes``, ``full_gathers``, ``skipped_tied`` (:class:`~verl.engines.weight_sync.reshard.ReshardStats`).

        Raises:
            WeightCheckError: the rollout refused the update's names or shapes (on any rank); nothing was written.
            whatever ``rollout.update_weights`` raises during the stream.
        """
        start = time.perf_counter()
        if shares_module(trainer, rollout):
            return {"tensors": 0, "bytes": 0, "seconds": time.perf_counter() - start, "shared": True}
        if serves_adapter(trainer, rollout):
            return self._sync_adapter(trainer, rollout, start)
        layout_fn = getattr(rollout, "weight_layout", None)
        layout = layout_fn() if callable(layout_fn) else None
        self._check(trainer, rollout, layout)
        counts = {"tensors": 0, "bytes": 0}

        def counted(pairs: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in pairs:
                counts["tensors"] += 1
                counts["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        extra: dict[str, Any] = {}
        if layout is None:
            rollout.update_weights(counted(trainer.iter_weights()))
        else:
            from verl.engines.weight_sync.reshard import ReshardStats

            stats = ReshardStats()
            rollout.update_weights(counted(trainer.iter_weights(layout, bucket_bytes=self.bucket_bytes, stats=stats)))
            extra = stats.as_metrics()
            extra.pop("tensors", None)
            extra.pop("bytes", None)
        return {**counts, **extra, "seconds": time.perf_counter() - start, "shared": False}

    @staticmethod
    def _sync_adapter(trainer: Any, rollout: Any, start: float) -> dict[str, Any]:
        """LoRA served as an adapter: only the adapter moves (its base is the rollout's own copy of the frozen
        model folder, loaded at start-up), as verl's non-merged sync after its first base sync."""
        tensors, config = trainer.lora_adapter()
        rollout.load_lora_adapter(tensors, config)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        return {
            "tensors": len(tensors),
            "bytes": size,
            "seconds": time.perf_counter() - start,
            "shared": False,
            "adapter": True,
        }

    @staticmethod
    def _check(trainer: Any, rollout: Any, layout: Any) -> None:
        """Let the rollout refuse the update up front; with a layout every rank learns every rank's verdict."""
        manifest_fn, check_fn = getattr(trainer, "weight_manifest", None), getattr(rollout, "check_weights", None)
        error = ""
        if callable(manifest_fn) and callable(check_fn):
            try:
                check_fn(manifest_fn(layout))
            except Exception as exc:  # any failure here must reach the other ranks, or they wait forever
                error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyError | ValueError) else str(exc)
        world = getattr(layout, "world_size", 1)
        errors = [error]
        if world > 1:
            import torch.distributed as dist

            errors = [None] * world
            dist.all_gather_object(errors, error)
        bad = [(rank, msg) for rank, msg in enumerate(errors) if msg]
        if bad:
            shown = "; ".join(f"rank {rank}: {msg}" for rank, msg in bad[:3])
            raise WeightCheckError(
                f"weight sync refused before writing anything (the rollout keeps its weights): {shown}"
            )


def build_colocated_checkpoint_engine(
    config: Any, *, options: ColocatedOptions | None, platform: Any = None
) -> ColocatedCheckpointEngine:
    """Build the ``colocated`` weight-sync engine from the root config (same-process hand-over, no disk).

    ``options``: the validated ``checkpoint_engine.engine_kwargs.colocated`` (:func:`verl.config.role_options`),
    None = the defaults. ``platform``: the worker's platform, accepted like every checkpoint factory's and not
    needed here."""
    return ColocatedCheckpointEngine(config.actor_rollout_ref.rollout.checkpoint_engine, options=options)
