"""Moving rows between the batch dim and the next dim: ``fold_batch_dim``, ``unfold_batch_dim`` and
``DataProto.unfold_column_chunks`` (follow the functions and the method of the same names in verl/protocol.py).

Every field moves together: tensors (nested TensorDict leaves included) and numpy non-tensor arrays get the
same reshape, so row ``i`` of every field still describes the same sample. Inputs are never modified
(verl's versions rewrite the input's ``non_tensor_batch`` / batch size in place); meta_info is copied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from verl.protocol.errors import DataProtoError, DataProtoKeyError, DataProtoSizeError, DataProtoTypeError
from verl.protocol.ops import check_int

if TYPE_CHECKING:  # pragma: no cover
    from verl.protocol.core import DataProto

__all__ = ["FoldingMixin", "fold_batch_dim", "unfold_batch_dim"]


def _leaves(data: DataProto) -> list[tuple[Any, torch.Tensor]]:
    if data.batch is None:
        return []
    return list(data.batch.items(include_nested=True, leaves_only=True))


def _rebuild(data: DataProto, tensors: dict, arrays: dict, rows: int) -> DataProto:
    batch = None
    if data.batch is not None:
        # Tuple keys rebuild nested TensorDicts with the new batch size.
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    return type(data)(batch=batch, non_tensor_batch=arrays, meta_info=dict(data.meta_info))


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Fold rows ``(bsz, ...)`` into ``(new_batch_size, bsz // new_batch_size, ...)``.

    Follows verl/protocol.py ``fold_batch_dim``: consecutive groups of ``bsz // new_batch_size`` rows
    become one row, for every tensor and every non-tensor array; the result has ``new_batch_size`` rows.
    E.g. 6 rows ``[a, a, b, b, c, c]`` folded to 3 give rows ``[a, a]``, ``[b, b]``, ``[c, c]``. Tensors are
    reshaped (views where the layout allows), arrays ``np.reshape``-d.

    Raises:
        DataProtoSizeError (an AssertionError, as verl asserts): ``len(data)`` is not divisible by
            ``new_batch_size``.
        DataProtoError / DataProtoTypeError: ``new_batch_size`` is not an int ``>= 1``.
    """
    new_batch_size = check_int(new_batch_size, "new_batch_size", 1)
    length = len(data)
    if length % new_batch_size:
        raise DataProtoSizeError(
            f"fold_batch_dim: {length} rows are not divisible by new_batch_size={new_batch_size} "
            f"({length} % {new_batch_size} = {length % new_batch_size})"
        )
    group = length // new_batch_size
    tensors = {key: value.reshape(new_batch_size, group, *value.shape[1:]) for key, value in _leaves(data)}
    arrays = {
        key: np.reshape(value, (new_batch_size, group, *value.shape[1:]))
        for key, value in data.non_tensor_batch.items()
    }
    return _rebuild(data, tensors, arrays, new_batch_size)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dims of every field into one batch dim (inverse of :func:`fold_batch_dim`).

    Follows verl/protocol.py ``unfold_batch_dim``: a field of shape ``(d0, ..., d{k-1}, *rest)`` (``k =
    batch_dims``) becomes ``(d0 * ... * d{k-1}, *rest)`` in row-major order, so folded row ``i`` unfolds
    to rows ``i * d1 ... (i + 1) * d1 - 1`` for ``k = 2``.

    Raises:
        DataProtoError: ``batch_dims < 1``; a field has fewer than ``batch_dims`` dims; nothing to read
            the leading dims from (no tensors and no arrays).
        DataProtoSizeError (an AssertionError): fields disagree on their first ``batch_dims`` dims (the
            keys and shapes are named).
    """
    batch_dims = check_int(batch_dims, "batch_dims", 1)
    fields: list[tuple[str, Any, tuple[int, ...]]] = [("batch", key, tuple(v.shape)) for key, v in _leaves(data)]
    fields += [("non_tensor_batch", key, v.shape) for key, v in data.non_tensor_batch.items()]
    if not fields:
        raise DataProtoError("unfold_batch_dim: the DataProto has no tensors or arrays to read the leading dims from")
    leading = None
    for where, key, shape in fields:
        if len(shape) < batch_dims:
            raise DataProtoError(f"unfold_batch_dim: {where}[{key!r}] has shape {shape}, fewer than {batch_dims} dims")
        if leading is None:
            leading, first = shape[:batch_dims], (where, key)
        elif shape[:batch_dims] != leading:
            raise DataProtoSizeError(
                f"unfold_batch_dim: {where}[{key!r}] starts with {shape[:batch_dims]} but {first[0]}[{first[1]!r}] "
                f"starts with {leading}; the first {batch_dims} dims must agree"
            )
    rows = math.prod(leading)
    tensors = {key: value.reshape(rows, *value.shape[batch_dims:]) for key, value in _leaves(data)}
    arrays = {key: np.reshape(value, (rows, *value.shape[batch_dims:])) for key, value in data.non_tensor_batch.items()}
    return _rebuild(data, tensors, arrays, rows)


class FoldingMixin:
    """``unfold_column_chunks``, mixed into :class:`verl.protocol.DataProto`."""

    batch: Any
    non_tensor_batch: dict
    meta_info: dict

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[Any] | None = None) -> DataProto:
        """Cut dim 1 of the ``split_keys`` fields into ``n_split`` pieces, each piece a row of its own.

        Follows verl/protocol.py ``unfold_column_chunks``. The result has ``len(self) * n_split`` rows;
        output row ``r * n_split + j`` holds piece ``j`` of input row ``r``:

        * a split field of shape ``(B, m, *rest)`` becomes ``(B * n_split, m // n_split, *rest)``
          (row ``[1, 2, 3, 4]`` with ``n_split=2`` gives rows ``[1, 2]`` and ``[3, 4]``);
        * a split 1-D object array of per-row sequences (how ``from_dict`` stores lists) has each
          sequence cut the same way, keeping its type (``["a1", "a2"]`` gives ``["a1"]``, ``["a2"]``);
        * every other field is repeated ``n_split`` times per row (``repeat_interleave``).

        With ``split_keys=None`` every field is repeated (what verl's docstring promises; verl's code
        fails on non-tensor arrays there). Nested batch keys are given as tuples.

        Raises:
            DataProtoKeyError: a split key is in neither ``batch`` nor ``non_tensor_batch`` (verl ignores it).
            DataProtoSizeError (an AssertionError): dim 1 (or a sequence length) is not divisible by ``n_split``.
            DataProtoError: a split field has no dim 1 to cut.
        """
        n_split = check_int(n_split, "n_split", 1)
        keys = set() if split_keys is None else {split_keys} if isinstance(split_keys, str) else set(split_keys)
        leaves = [] if self.batch is None else list(self.batch.items(include_nested=True, leaves_only=True))
        unknown = keys - {key for key, _ in leaves} - set(self.non_tensor_batch)
        if unknown:
            raise DataProtoKeyError(
                f"unfold_column_chunks: split_keys {sorted(map(str, unknown))} are in neither batch nor "
                "non_tensor_batch"
            )
        tensors = {}
        for key, value in leaves:
            if key in keys:
                _check_cut(value.shape, n_split, f"batch[{key!r}]")
                tensors[key] = value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])
            else:
                tensors[key] = torch.repeat_interleave(value, n_split, dim=0)
        arrays = {}
        for key, value in self.non_tensor_batch.items():
            if key not in keys:
                arrays[key] = np.repeat(value, n_split, axis=0)
            elif value.ndim >= 2:
                _check_cut(value.shape, n_split, f"non_tensor_batch[{key!r}]")
                arrays[key] = value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])
            else:
                arrays[key] = _cut_sequences(value, n_split, key)
        return _rebuild(self, tensors, arrays, len(self) * n_split)  # type: ignore[arg-type]


def _check_cut(shape: Sequence[int], n_split: int, where: str) -> None:
    if len(shape) < 2:
        raise DataProtoError(f"unfold_column_chunks: {where} has shape {tuple(shape)}; a split field needs a dim 1")
    if shape[1] % n_split:
        raise DataProtoSizeError(
            f"unfold_column_chunks: dim 1 of {where} ({shape[1]}) is not divisible by n_split={n_split}"
        )


def _cut_sequences(values: np.ndarray, n_split: int, key: str) -> np.ndarray:
    pieces = []
    for row, item in enumerate(values):
        if not isinstance(item, list | tuple | np.ndarray):
            raise DataProtoTypeError(
                f"unfold_column_chunks: non_tensor_batch[{key!r}] row {row} is a {type(item).__name__}; a split "
                "1-D array must hold one list/tuple/array per row"
            )
        if len(item) % n_split:
            raise DataProtoSizeError(
                f"unfold_column_chunks: non_tensor_batch[{key!r}] row {row} has {len(item)} entries, not divisible "
                f"by n_split={n_split}"
            )
        width = len(item) // n_split
        pieces.extend(item[j * width : (j + 1) * width] for j in range(n_split))
    return np.fromiter(pieces, dtype=object, count=len(pieces))
