"""Colocated weight sync: hand the trainer's tensors to a rollout engine in the same process.

Source of the design: verl ``ActorRolloutRefWorker.update_weights`` (``mode="naive"``, anatomy §6.3):
export ``(name, tensor)`` pairs from the training engine and feed them to ``rollout.update_weights``.
No disk, no serialisation, no extra copy beyond the rollout's in-place ``copy_``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

# Attributes under which engines expose their live nn.Module (the reference engines use ``model``).
_MODULE_ATTRS = ("model", "module")


def _live_module(engine: Any) -> torch.nn.Module | None:
    for attr in _MODULE_ATTRS:
        module = getattr(engine, attr, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def shares_module(trainer: Any, rollout: Any) -> bool:
    """True when trainer and rollout hold the very same ``nn.Module`` object (no copy)."""
    a, b = _live_module(trainer), _live_module(rollout)
    return a is not None and a is b


class ColocatedCheckpointEngine:
    """Weight sync for a trainer and a rollout engine living in one process (``colocated``).

    :meth:`sync` calls ``rollout.update_weights(trainer.iter_weights())`` and returns metrics.

    Shared modules: when the rollout engine was built around the trainer's own module (same object, e.g.
    ``HFRolloutEngine(trainer.model, tokenizer, cfg)``), the optimizer updates the rollout's weights in
    place and :meth:`sync` is a no-op (``shared: True``, zero tensors). Sharing is safe here because

    * the reference rollout never casts, moves or offloads a module it was given (its ``dtype`` setting does
      not apply: generation runs in the trainer's dtype, float32 on CPU), so the trainer's master weights
      are never rounded to bfloat16 behind the optimizer's back;
    * generation runs under ``torch.no_grad`` in eval mode and restores the module's train/eval flag;
    * trainer and rollout run one after the other in one process, so generation never sees a half-applied
      optimizer step.

    Sharing is *not* safe, and a separate copy (a model path) must be used, when the rollout must run in a
    different dtype or device than the trainer, or when the trainer's parameters are sharded (FSDP/DTensor):
    a shared sharded module would need collective forwards on every rank during generation.

    Args:
        config: accepted for factory symmetry (``checkpoint_engine`` section); unused.
    """

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def sync(self, trainer: Any, rollout: Any) -> dict[str, Any]:
        """Push the trainer's current weights into ``rollout``.

        Returns:
            ``{"tensors": int, "bytes": int, "seconds": float, "shared": bool}``; ``bytes`` counts the
            trainer-side tensors handed over (numel x element size).

        Raises:
            whatever ``rollout.update_weights`` raises for unknown names or shape mismatches.
        """
        start = time.perf_counter()
        if shares_module(trainer, rollout):
            return {"tensors": 0, "bytes": 0, "seconds": time.perf_counter() - start, "shared": True}
        counts = {"tensors": 0, "bytes": 0}

        def counted(pairs: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in pairs:
                counts["tensors"] += 1
                counts["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        rollout.update_weights(counted(trainer.iter_weights()))
        return {**counts, "seconds": time.perf_counter() - start, "shared": False}
