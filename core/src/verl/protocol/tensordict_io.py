"""DataProto <-> one TensorDict (``DataProto.to_tensordict`` / ``DataProto.from_tensordict``).

Follows verl/protocol.py and ``get_tensordict`` in verl/utils/tensordict_utils.py ("protocol v2", the
TensorDict that verl's new engines exchange). The mapping:

=====================================  =======================================================
DataProto                              TensorDict (``batch_size == [len(data)]``)
=====================================  =======================================================
``batch[key]`` (tensor, nested too)    ``td[key]``, the same tensor object (no copy)
``non_tensor_batch[key]`` (ndarray)    ``NonTensorStack`` of one ``NonTensorData`` per row
``meta_info[key]``                     ``NonTensorData`` (one value for the whole batch)
=====================================  =======================================================

A key may appear in only one of the three fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase, is_non_tensor

from verl.protocol.errors import DataProtoError, DataProtoKeyError, DataProtoTypeError
from verl.protocol.indexing import to_object_array

__all__ = ["TensorDictIOMixin"]


class TensorDictIOMixin:
    """``to_tensordict`` / ``from_tensordict``, mixed into :class:`verl.protocol.DataProto`."""

    batch: Any
    non_tensor_batch: dict
    meta_info: dict

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding all three fields (follows verl/protocol.py ``to_tensordict``).

        Returns a TensorDict with ``batch_size == [len(self)]`` and the device of ``self.batch``. Tensors
        are shared, not copied. Each non-tensor array becomes a ``NonTensorStack`` whose row ``i`` wraps
        ``array[i]`` (``td[key]`` then reads as a list of rows); each meta_info entry becomes a
        ``NonTensorData``. :meth:`from_tensordict` inverts it. verl needs a batch here; a DataProto without
        one converts too.

        Raises:
            DataProtoKeyError: a key is in more than one field (verl asserts the same).
        """
        length = len(self)
        if self.batch is None:
            out = TensorDict({}, batch_size=[length])
        else:
            out = self.batch.copy()
        taken = set(out.keys())
        for where, keys in (("non_tensor_batch", self.non_tensor_batch), ("meta_info", self.meta_info)):
            clash = sorted(map(str, taken & set(keys)))
            if clash:
                raise DataProtoKeyError(
                    f"to_tensordict: {where} keys {clash} are also batch or non_tensor_batch keys; one TensorDict "
                    "holds each key once, rename one of them"
                )
            taken |= set(keys)
        for key, value in self.non_tensor_batch.items():
            out.set(key, NonTensorStack.from_list([NonTensorData(item) for item in value]))
        for key, value in self.meta_info.items():
            out.set(key, NonTensorData(value, batch_size=out.batch_size, device=out.device))
        return out

    @classmethod
    def from_tensordict(
        cls, tensor_dict: TensorDictBase | None = None, meta_info: Mapping | None = None, num_batch_dims: int = 1
    ) -> Any:
        """Build a DataProto from a TensorDict (follows verl/protocol.py ``from_tensordict``).

        Tensors (and nested TensorDicts) go to ``batch``, ``NonTensorStack`` entries to ``non_tensor_batch``
        and ``NonTensorData`` entries to ``meta_info`` (added to a copy of ``meta_info``; verl writes into
        the caller's dict). A stack becomes a 1-D ``object`` array with one element per row (as in verl),
        except that a stack of numpy scalars of one dtype becomes a typed array of that dtype, so a typed
        array survives ``to_tensordict`` -> ``from_tensordict``. ``batch`` is ``None`` when there are no
        tensors (and non-tensor rows give the length); verl needs a tensor there.

        Args:
            tensor_dict: batch size ``[N]``, or ``[]`` with every entry of leading size ``N``.
            num_batch_dims: must be 1 (a DataProto has one batch dim; verl accepts more only to fail later).

        Raises:
            DataProtoTypeError: ``tensor_dict`` is not a TensorDict.
            DataProtoError: ``num_batch_dims != 1``, or a ``NonTensorStack`` with more than one batch dim.
            DataProtoSizeError: entries disagree on the row count (from the DataProto's own checks).
        """
        if not isinstance(tensor_dict, TensorDictBase):
            raise DataProtoTypeError(f"from_tensordict expects a TensorDict, got {type(tensor_dict).__name__}")
        if num_batch_dims != 1:
            raise DataProtoError(f"DataProto supports num_batch_dims=1 only, got num_batch_dims={num_batch_dims}")
        meta = dict(meta_info or {})
        tensors: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        rows = int(tensor_dict.batch_size[0]) if tensor_dict.batch_dims >= 1 else None
        for key, value in tensor_dict.items():
            if isinstance(value, NonTensorStack):
                if value.batch_dims != 1:
                    raise DataProtoError(
                        f"from_tensordict: {key!r} is a NonTensorStack of batch size {tuple(value.batch_size)}; "
                        "a DataProto column needs exactly one batch dim"
                    )
                arrays[key] = _stack_to_array(value.tolist(), key)
            elif is_non_tensor(value):
                meta[key] = value.data
            else:
                tensors[key] = value
        if rows is None:
            firsts = [int(value.shape[0]) for value in tensors.values() if value.ndim >= 1]
            rows = firsts[0] if firsts else None
        batch = None
        if tensors or (not arrays and rows is not None):
            if rows is None:
                raise DataProtoError("from_tensordict: cannot tell the row count: the TensorDict has no batch dim")
            batch = TensorDict(tensors, batch_size=[rows], device=tensor_dict.device)
        return cls(batch=batch, non_tensor_batch=arrays, meta_info=meta)


def _stack_to_array(values: list, key: str) -> np.ndarray:
    if values and all(isinstance(value, np.generic) for value in values):
        dtypes = {value.dtype for value in values}
        if len(dtypes) == 1:
            return np.array(values, dtype=dtypes.pop())
    return to_object_array(values, key)
