"""``verl.protocol``: DataProto, the batch container exchanged between controller and workers.

Follows verl/protocol.py. ``from verl.protocol import DataProto`` and ``from verl import DataProto`` both
work, as do verl's module-level imports (``from verl.protocol import fold_batch_dim, unfold_batch_dim,
serialize_tensordict, deserialize_tensordict, union_tensor_dict, ...``). Modules:
:mod:`~verl.protocol.core` (DataProto, DataProtoItem), :mod:`~verl.protocol.ops`
(chunk/split/concat/repeat/padding/iteration), :mod:`~verl.protocol.folding` (fold/unfold),
:mod:`~verl.protocol.tensordict_io` (to/from one TensorDict), :mod:`~verl.protocol.padding` (pad/unpad
helpers), :mod:`~verl.protocol.unions` (merging), :mod:`~verl.protocol.equality`,
:mod:`~verl.protocol.indexing`, :mod:`~verl.protocol.serialization` (pickling, verl's numpy codec),
:mod:`~verl.protocol.settings`, :mod:`~verl.protocol.errors`.
"""

from verl.protocol.collate import collate_fn
from verl.protocol.core import DataProto, DataProtoItem
from verl.protocol.equality import deep_equal
from verl.protocol.errors import (
    DataProtoConflictError,
    DataProtoError,
    DataProtoIndexError,
    DataProtoKeyError,
    DataProtoSizeError,
    DataProtoTypeError,
)
from verl.protocol.folding import fold_batch_dim, unfold_batch_dim
from verl.protocol.padding import pad_dataproto_to_divisor, unpad_dataproto
from verl.protocol.serialization import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
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
    "DataProtoConflictError",
    "DataProtoError",
    "DataProtoIndexError",
    "DataProtoItem",
    "DataProtoKeyError",
    "DataProtoSizeError",
    "DataProtoTypeError",
    "collate_fn",
    "deep_equal",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "merge_meta_info",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
]
