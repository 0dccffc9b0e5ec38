"""``verl.protocol``: DataProto, the batch container exchanged between controller and workers.

Follows verl/protocol.py. ``from verl.protocol import DataProto`` and ``from verl import DataProto`` both
work. Modules: :mod:`~verl.protocol.core` (DataProto, DataProtoItem), :mod:`~verl.protocol.ops`
(chunk/split/concat/repeat/padding/iteration), :mod:`~verl.protocol.padding` (pad/unpad helpers),
:mod:`~verl.protocol.unions` (merging), :mod:`~verl.protocol.equality`, :mod:`~verl.protocol.indexing`,
:mod:`~verl.protocol.serialization`, :mod:`~verl.protocol.settings`, :mod:`~verl.protocol.errors`.
"""

from verl.protocol.collate import collate_fn
from verl.protocol.core import DataProto, DataProtoItem
from verl.protocol.equality import deep_equal
from verl.protocol.errors import DataProtoError, DataProtoIndexError, DataProtoKeyError, DataProtoTypeError
from verl.protocol.padding import pad_dataproto_to_divisor, unpad_dataproto
from verl.protocol.settings import AUTO_PADDING_KEY, DataProtoConfig
from verl.protocol.unions import (
    list_of_dict_to_dict_of_list,
    merge_meta_info,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)

__all__ = [
    "AUTO_PADDING_KEY",
    "DataProto",
    "DataProtoConfig",
    "DataProtoError",
    "DataProtoIndexError",
    "DataProtoItem",
    "DataProtoKeyError",
    "DataProtoTypeError",
    "collate_fn",
    "deep_equal",
    "list_of_dict_to_dict_of_list",
    "merge_meta_info",
    "pad_dataproto_to_divisor",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
]
