"""Measure the tensor memory a block of code allocates, independently of the code's own accounting.

:class:`AllocationTracker` is a ``TorchDispatchMode``: every aten op run inside it is seen, and an output
whose storage is new (not one of the op's inputs' storages, nor one already seen) counts as an allocation
until the storage is freed (a ``weakref.finalize`` on the storage, which torch keeps unique per allocation).
So it tracks the live bytes of tensors created inside the block, their peak, and the largest single
allocation, on any device. Views, in-place ops and storages that existed before the block cost nothing;
memory allocated outside torch's dispatcher (a collective backend's internal buffers) is not seen.

Used by the weight-sync tests to show that no rank materialises the whole model during a resharded sync.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


class AllocationTracker(TorchDispatchMode):
    """Peak live bytes of tensors allocated inside ``with AllocationTracker() as t:``.

    Attributes:
        current: bytes allocated in the block and still alive.
        peak: the maximum of ``current`` (bytes).
        largest: the largest single new storage (bytes).
        shapes: ``(shape, dtype)`` of every new allocation, in order (for assertions on what was built).
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self.largest = 0
        self.shapes: list[tuple[tuple[int, ...], torch.dtype]] = []
        self._live: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._live:
            self._live.discard(key)
            self.current -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and not is_traceable_wrapper_subclass(t)
        }
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or is_traceable_wrapper_subclass(t):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._live:
                continue
            self._live.add(key)
            self.current += nbytes
            self.peak = max(self.peak, self.current)
            self.largest = max(self.largest, nbytes)
            self.shapes.append((tuple(t.shape), t.dtype))
            weakref.finalize(storage, self._free, key, nbytes)
        return out
