"""The ``hf`` rollout's weights: checked updates (whole tensors or TP shards), and sleep / wake-up.

Sleep frees the memory of the weights the engine owns (a model it loaded itself; a module shared with the
trainer is the trainer's and is never touched), at the storage level, as FSDP2 does, so shapes, DTensor
metadata and tied parameters survive:

* level 1 (verl's vLLM level 1): on an accelerator, copy each weight to host memory and free the device
  copy; ``wake_up(["weights"])`` copies it back. On the CPU there is nothing to free (the host *is* where
  level 1 would move them): a no-op.
* level 2 (verl's default on CUDA): discard the weights (storage resized to 0, on any device);
  ``wake_up(["weights"])`` re-allocates them uninitialised and the next weight sync must fill every one
  before generating (:meth:`RolloutWeights.stale` names what is missing).

The KV cache is allocated inside each ``generate`` call for that batch and freed when it returns, so the
``kv_cache`` tag has nothing to release or restore here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from verl.engines.reference.tensor_parallel import copy_into_parameter, local_tensor

SLEEP_LEVELS = (1, 2)
TAGS = ("weights", "kv_cache")


class UnknownWeightError(KeyError):
    """``update_weights`` received a parameter name the rollout model does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StaleWeightsError(RuntimeError):
    """Generation was asked for while weights discarded by a level-2 sleep have not been synced back."""


def check_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """``tags`` as a tuple (None = both), or ValueError naming the unknown ones."""
    chosen = TAGS if tags is None else tuple(tags)
    bad = [t for t in chosen if t not in TAGS]
    if bad:
        raise ValueError(f"wake_up tags must be among {list(TAGS)}, got {bad}")
    return chosen


class RolloutWeights:
    """Live weights of one rollout model: name checks, in-place updates, storage-level sleep.

    Args:
        model: the live ``nn.Module``.
        owned: the engine loaded it (sleep may free it); False for a module shared with the trainer.
        device: where the model runs.
        sleep_level: 1 or 2 (see the module doc).
        layout: the TP layout when the parameters are DTensor shards (or the world's layout), else None.
        rank: this rank's global rank in ``layout``.

    Raises:
        ValueError: a sleep level other than 1 or 2.
    """

    def __init__(
        self, model: torch.nn.Module, *, owned: bool, device: torch.device, sleep_level: int, layout: Any, rank: int
    ) -> None:
        if sleep_level not in SLEEP_LEVELS:
            raise ValueError(f"rollout sleep_level must be one of {SLEEP_LEVELS}, got {sleep_level!r}")
        self.model = model
        self.owned = owned
        self.device = device
        self.sleep_level = int(sleep_level)
        self.layout = layout
        self.rank = rank
        self.asleep = False
        # What sleep freed, to re-allocate on wake-up: (tensor owning the storage, its bytes, level-1 host copy).
        self._saved: list[tuple[torch.Tensor, int, torch.Tensor | None]] = []
        self._stale: set[str] = set()
        self._aliases = _alias_groups(model)

    # ------------------------------------------------------------------ updates
    def _targets(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict(keep_vars=True)

    def check(self, specs: Iterable[tuple[str, Sequence[int]]]) -> None:
        """Refuse an update before anything is written: every name known, every shape a shard or the full one.

        Raises:
            UnknownWeightError (KeyError): a name the model does not have (closest names suggested).
            ValueError: a shape that is neither this rank's shard nor the full tensor (both named).
        """
        targets = self._targets()
        for name, shape in specs:
            target = targets.get(name)
            if target is None:
                raise _unknown(name, targets)
            allowed = {tuple(target.shape), tuple(local_tensor(target).shape)}
            if tuple(shape) not in allowed:
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(shape)}; the rollout expects "
                    f"{' or '.join(str(s) for s in sorted(allowed))}"
                )

    def update(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs into the model in place (dtype/device converted); returns the count.

        A tensor may be the full weight (sliced here for a shard) or exactly this rank's shard. A tensor that
        already *is* the live parameter (shared module) is skipped. Tied names address one tensor: either
        may be sent. An engine asleep wakes its weights first (as verl's hybrid engine does before a sync).

        Raises:
            UnknownWeightError, ValueError: as :meth:`check`, for the pair that fails (earlier pairs are
                written: call :meth:`check` first for all-or-nothing updates).
        """
        if self.asleep:  # weights freed by sleep() must exist again before anything is written into them
            self.wake_up()
        targets = self._targets()
        count = 0
        with torch.no_grad():
            for name, tensor in weights:
                target = targets.get(name)
                if target is None:
                    raise _unknown(name, targets)
                live = local_tensor(target)
                if tensor.data_ptr() == live.data_ptr() and tensor.dtype == live.dtype and tensor.shape == live.shape:
                    count += 1
                    continue
                copy_into_parameter(name, target, tensor, self.layout, self.rank)
                self._stale.difference_update(self._aliases.get(name, (name,)))
                count += 1
        return count

    def stale(self) -> list[str]:
        """Weights discarded by a level-2 sleep and not written since (empty when all are current)."""
        return sorted(self._stale)

    def require_current(self) -> None:
        """Raise :class:`StaleWeightsError` when some weights were discarded and not synced back."""
        if self._stale:
            names = self.stale()
            raise StaleWeightsError(
                f"rollout weights discarded by sleep(level=2) were not synced back ({len(names)} missing, e.g. "
                f"{names[:3]}): call update_weights with every weight after wake_up (the trainer's weight sync does), "
                "or use actor_rollout_ref.rollout.engine_kwargs.hf.sleep_level=1"
            )

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Free the owned weights' memory as the level says (no-op when shared, asleep, or level 1 on CPU)."""
        if self.asleep or not self.owned or (self.sleep_level == 1 and self.device.type == "cpu"):
            return
        self._saved = []
        for tensor in _unique_storage_tensors(self.model):
            storage = tensor.untyped_storage()
            nbytes = storage.nbytes()
            backup = host_copy(storage, pin=self.device.type == "cuda") if self.sleep_level == 1 else None
            storage.resize_(0)
            self._saved.append((tensor, nbytes, backup))
        self.asleep = True
        _empty_cache(self.device)

    def wake_up(self) -> None:
        """Re-allocate what :meth:`sleep` freed (level 1: restore the values; level 2: mark every weight stale)."""
        if not self.asleep:
            return
        for tensor, nbytes, backup in self._saved:
            storage = tensor.untyped_storage()
            storage.resize_(nbytes)
            if backup is not None:
                restore_from_host(storage, backup)
        if self.sleep_level == 2:
            self._stale = {name for name, _ in self.model.named_parameters(remove_duplicate=False)}
        self._saved = []
        self.asleep = False

    def owned_bytes(self) -> int:
        """Bytes of the (local) parameter storages this engine would free when sleeping."""
        return sum(t.untyped_storage().nbytes() for t in _unique_storage_tensors(self.model))


def _bytes_view(storage: Any) -> torch.Tensor:
    """A flat ``uint8`` tensor over all of ``storage`` (any device)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def host_copy(storage: Any, *, pin: bool) -> torch.Tensor:
    """A host ``uint8`` copy of ``storage`` (page-locked when ``pin``, for a fast copy back)."""
    backup = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pin)
    backup.copy_(_bytes_view(storage))
    return backup


def restore_from_host(storage: Any, backup: torch.Tensor) -> None:
    """Copy ``backup`` (from :func:`host_copy`) back into ``storage``, already resized to its bytes."""
    _bytes_view(storage).copy_(backup)


def _unknown(name: str, targets: dict[str, Any]) -> UnknownWeightError:
    close = difflib.get_close_matches(name, list(targets), n=3)
    return UnknownWeightError(
        f"update_weights: the rollout model has no parameter {name!r}"
        + (f"; did you mean {close}?" if close else f" ({len(targets)} known names)")
    )


def _alias_groups(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """``{name: every name of the same parameter}`` (tied embeddings have two names)."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return {name: tuple(names) for names in by_id.values() for name in names}


def _unique_storage_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """One local tensor per distinct parameter storage, listed before anything is resized (tied parameters
    share one storage); storages backed by files are first replaced by owned, resizable copies."""
    from torch.distributed.tensor import DTensor

    kept: list[Any] = []  # the storage objects themselves: their ids stay unique while they are held here
    tensors: list[torch.Tensor] = []
    for param in model.parameters():
        tensor = local_tensor(param)
        if not tensor.untyped_storage().resizable():
            # from_pretrained can hand out memory-mapped checkpoint storage, which cannot be resized: own a copy.
            owned = tensor.detach().clone()
            if isinstance(param, DTensor):
                param._local_tensor = owned
            else:
                param.data = owned
            tensor = local_tensor(param)
        storage = tensor.untyped_storage()
        if any(storage is other for other in kept):
            continue
        kept.append(storage)
        tensors.append(tensor)
    return tensors


def _empty_cache(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "empty_cache"):
        module.empty_cache()
