"""Collate DataProtoItems back into a DataProto (for a torch ``DataLoader`` iterating a DataProto)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from verl.protocol.core import DataProto, DataProtoItem
from verl.protocol.errors import DataProtoError, DataProtoKeyError
from verl.protocol.indexing import to_object_array

__all__ = ["collate_fn"]


def collate_fn(items: Sequence[DataProtoItem]) -> DataProto:
    """Stack DataProtoItems (e.g. from a torch ``DataLoader`` over a DataProto) into one DataProto.

    Follows verl/protocol.py ``collate_fn``: tensors are stacked (one ``torch.stack`` per TensorDict
    call). A non-tensor key whose row values are numpy scalars/arrays is ``np.stack``-ed (dtype kept);
    otherwise it becomes a 1-D object array. meta_info is not carried (as in verl).

    Raises:
        DataProtoError: no items, or items with different non-tensor keys.
    """
    items = list(items)
    if not items:
        raise DataProtoError("collate_fn needs at least one DataProtoItem")
    batch = None
    if items[0].batch is not None:
        batch = torch.stack([item.batch for item in items]).contiguous()
    keys = list(items[0].non_tensor_batch)
    arrays = {}
    for key in keys:
        try:
            values = [item.non_tensor_batch[key] for item in items]
        except KeyError:
            raise DataProtoKeyError(f"collate_fn: non_tensor_batch[{key!r}] is missing from some items") from None
        if all(isinstance(value, np.ndarray | np.generic) for value in values):
            arrays[key] = np.stack(values)
        else:
            arrays[key] = to_object_array(values, key)
    return DataProto(batch=batch, non_tensor_batch=arrays)
