"""Pad a DataProto so that workers get equal chunks, and strip the padding afterwards.

Follows ``pad_dataproto_to_divisor`` / ``unpad_dataproto`` in verl/protocol.py: padding rows are copies
of the *leading* rows, cycled as often as needed, so a batch of 2 rows padded to a divisor of 8 becomes
rows ``[0, 1, 0, 1, 0, 1, 0, 1]`` (known failure K11: copying the leading rows only once gives 4).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from verl.protocol.errors import DataProtoError, DataProtoTypeError
from verl.protocol.indexing import RowIndex
from verl.protocol.ops import check_int

if TYPE_CHECKING:  # pragma: no cover
    from verl.protocol.core import DataProto

__all__ = ["pad_dataproto_to_divisor", "unpad_dataproto"]

logger = logging.getLogger(__name__)


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Return ``(padded, pad_size)`` with ``len(padded) % size_divisor == 0``.

    ``pad_size = (-len(data)) % size_divisor`` rows are appended; padding row ``j`` is a copy of row
    ``j % len(data)`` (all tensor and non-tensor fields alike; meta_info unchanged). Works for any
    divisor, including one larger than the batch. When no padding is needed ``data`` itself is returned.
    An empty DataProto is returned unchanged with a warning, as in verl.

    Raises:
        DataProtoTypeError: ``data`` is not a DataProto or ``size_divisor`` is not an int.
        DataProtoError: ``size_divisor < 1``.
    """
    from verl.protocol.core import DataProto

    if not isinstance(data, DataProto):
        raise DataProtoTypeError(f"pad_dataproto_to_divisor expects a DataProto, got {type(data).__name__}")
    size_divisor = check_int(size_divisor, "size_divisor", 1)
    length = len(data)
    pad_size = (-length) % size_divisor
    if length == 0:
        logger.warning("padding a DataProto with no rows; nothing changed")
        return data, 0
    if pad_size == 0:
        return data, 0
    rows = np.arange(length + pad_size, dtype=np.int64) % length
    return data._take(RowIndex(rows)), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows (``data[:-pad_size]``); ``pad_size == 0`` returns ``data``.

    Follows verl/protocol.py ``unpad_dataproto``.

    Raises:
        DataProtoError: ``pad_size`` is negative or larger than ``len(data)``.
    """
    pad_size = check_int(pad_size, "pad_size", 0)
    if pad_size > len(data):
        raise DataProtoError(f"cannot unpad {pad_size} rows from a DataProto of {len(data)} rows")
    if pad_size == 0:
        return data
    return data[: len(data) - pad_size]
