"""Row-index normalisation shared by ``__getitem__``, ``select_idxs``, ``reorder`` and the padding helpers.

verl/protocol.py ``select_idxs`` accepts a list, ``np.ndarray`` or ``torch.Tensor`` holding either
integer positions or a boolean mask. Here every such index is validated once (1-D, integer or bool, in
range, mask length == batch length) and turned into one int64 position array used for both the tensors
and the numpy arrays, so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol.errors import DataProtoError, DataProtoIndexError, DataProtoTypeError

__all__ = ["RowIndex", "normalize_row_index", "to_object_array"]


class RowIndex:
    """Validated row positions: ``numpy`` (int64, for non-tensor arrays) and ``torch`` (int64, CPU)."""

    __slots__ = ("numpy", "torch")

    def __init__(self, positions: np.ndarray) -> None:
        self.numpy = positions
        self.torch = torch.from_numpy(positions)

    def __len__(self) -> int:
        return int(self.numpy.shape[0])


def normalize_row_index(index: Any, length: int, what: str = "index") -> RowIndex:
    """Turn a list / ``np.ndarray`` / ``torch.Tensor`` of row ids or a boolean mask into :class:`RowIndex`.

    Args:
        index: 1-D integer positions (negative values count from the end) or a 1-D boolean mask of
            exactly ``length`` entries. An empty list selects nothing.
        length: number of rows of the DataProto being indexed.
        what: name used in error messages (e.g. ``"reorder indices"``).

    Raises:
        DataProtoTypeError: unsupported container or dtype (float, object, ...).
        DataProtoError: the index is not 1-D, or a mask's length differs from ``length``.
        DataProtoIndexError: a position is outside ``[-length, length)``.
    """
    if isinstance(index, torch.Tensor):
        array = index.detach().cpu().numpy()
    elif isinstance(index, np.ndarray):
        array = index
    elif isinstance(index, list | tuple | range):
        array = np.asarray(index) if len(index) else np.zeros(0, dtype=np.int64)
    else:
        raise DataProtoTypeError(
            f"{what} must be a list, np.ndarray or torch.Tensor of ints or bools, got {type(index).__name__}"
        )
    if array.ndim != 1:
        raise DataProtoError(f"{what} must be 1-D, got shape {tuple(array.shape)}")
    if array.dtype == np.bool_:
        if array.shape[0] != length:
            raise DataProtoError(f"boolean {what} has {array.shape[0]} entries but the DataProto has {length} rows")
        return RowIndex(np.flatnonzero(array).astype(np.int64, copy=False))
    if array.dtype.kind not in "iu":
        raise DataProtoTypeError(f"{what} must hold integers or bools, got dtype {array.dtype}")
    positions = array.astype(np.int64, copy=True)
    if positions.size:
        low, high = int(positions.min()), int(positions.max())
        if low < -length or high >= length:
            bad = low if low < -length else high
            raise DataProtoIndexError(f"{what} contains {bad}, out of range for a DataProto of {length} rows")
        positions[positions < 0] += length
    return RowIndex(positions)


def to_object_array(values: Sequence[Any], key: str) -> np.ndarray:
    """Wrap a Python sequence as a 1-D ``object`` array with one element per row.

    Unlike ``np.array(values, dtype=object)`` (what verl's ``from_dict`` does), equal-length nested lists
    are kept as per-row Python objects instead of becoming a 2-D array, so ``arr[i]`` is always row ``i``.

    Raises:
        DataProtoTypeError: ``values`` is not a sized sequence (e.g. a scalar or a generator).
    """
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise DataProtoTypeError(
            f"non_tensors[{key!r}] must be a np.ndarray or a list/tuple with one entry per row, "
            f"got {type(values).__name__}"
        )
    return np.fromiter(values, dtype=object, count=len(values))
