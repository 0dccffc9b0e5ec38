"""Flat byte buckets for weight sync: sizing, packing plan, JSON header, zero-copy unpacking.

A bucket is one contiguous ``uint8`` tensor holding the raw bytes of several weights, each at an
offset aligned to :data:`ALIGN` bytes so that ``bucket[offset:offset + nbytes].view(dtype)`` is legal
for every dtype (and cache/DMA friendly). Its header lists, per weight, ``name``, ``dtype`` (torch name,
e.g. ``"bfloat16"``), ``shape`` and byte ``offset``; it travels as UTF-8 JSON (not pickle: a receiver
never executes what the wire carries). Same idea as verl's ``TensorMeta`` (``verl/checkpoint_engine``),
except that a tensor larger than a bucket is sent whole in a bucket of its own instead of being split.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

ALIGN = 64  # bytes; a multiple of every torch element size (complex128 = 16)
MIB = 1 << 20


class BucketHeaderError(ValueError):
    """A bucket header that cannot be decoded (corrupt bytes, unknown dtype, out-of-range offsets)."""


def bucket_capacity_bytes(megabytes: float) -> int:
    """Bucket capacity in bytes for ``update_weights_bucket_megabytes`` (MiB: ``megabytes * 2**20``).

    Raises:
        ValueError: ``megabytes`` is not a positive number, or rounds to fewer than :data:`ALIGN` bytes.
    """
    if isinstance(megabytes, bool) or not isinstance(megabytes, int | float) or megabytes <= 0:
        raise ValueError(
            f"checkpoint_engine.update_weights_bucket_megabytes must be a positive number of MiB, got {megabytes!r}"
        )
    capacity = int(megabytes * MIB)
    if capacity < ALIGN:
        raise ValueError(f"bucket size {megabytes!r} MiB = {capacity} bytes is below the {ALIGN}-byte minimum")
    return capacity


def align_up(nbytes: int, align: int = ALIGN) -> int:
    """Smallest multiple of ``align`` that is ``>= nbytes``."""
    return -(-nbytes // align) * align


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Payload bytes of ``tensor``: ``numel * element_size``."""
    return tensor.numel() * tensor.element_size()


class BucketPlanner:
    """Streaming placement of tensors (by byte size, in arrival order) into buckets of ``capacity`` bytes.

    Greedy and order-preserving, as the sender streams: a tensor joins the open bucket if its
    :data:`ALIGN`-aligned offset plus its size fits, otherwise the open bucket is closed first. A tensor
    larger than ``capacity`` closes the open bucket and goes alone in one of its own (which the next
    tensor closes in turn).

    Attributes:
        open_nbytes: bytes used by the open bucket (end of its last tensor).
        closed_nbytes: bytes of the bucket closed by the last :meth:`place` that returned ``True``.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.open_nbytes = 0
        self.closed_nbytes = 0
        self._open_count = 0

    def place(self, nbytes: int) -> tuple[bool, int]:
        """Place a tensor of ``nbytes``; return ``(closes_open_bucket, byte_offset_in_its_bucket)``."""
        offset = align_up(self.open_nbytes)
        closes = self._open_count > 0 and offset + nbytes > self.capacity
        if closes:
            self.closed_nbytes = self.open_nbytes
        if closes or self._open_count == 0:
            offset, self._open_count = 0, 0
        self._open_count += 1
        self.open_nbytes = offset + nbytes
        return closes, offset


def plan_buckets(sizes: Sequence[int], capacity: int) -> list[list[tuple[int, int]]]:
    """Bucket layout that :class:`BucketPlanner` gives ``sizes`` (byte sizes, in arrival order).

    Returns:
        One list per bucket of ``(tensor_index, byte_offset)`` pairs.
    """
    planner = BucketPlanner(capacity)
    buckets: list[list[tuple[int, int]]] = []
    for index, size in enumerate(sizes):
        closes, offset = planner.place(size)
        if closes or not buckets:
            buckets.append([])
        buckets[-1].append((index, offset))
    return buckets


def encode_header(entries: Iterable[dict[str, Any]]) -> bytes:
    """Serialise ``[{"name", "dtype", "shape", "offset"}, ...]`` as UTF-8 JSON."""
    return json.dumps(list(entries), separators=(",", ":")).encode("utf-8")


def header_entry(name: str, tensor: torch.Tensor, offset: int) -> dict[str, Any]:
    """Header record of one tensor placed at ``offset`` bytes in its bucket."""
    return {
        "name": name,
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "offset": offset,
    }


def entry_nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    """Payload bytes of a header entry: ``prod(shape) * dtype.itemsize`` (1 element for ``shape == ()``)."""
    return math.prod(shape) * dtype.itemsize


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise BucketHeaderError(f"bucket header: unknown dtype {name!r}")
    return dtype


def decode_header(raw: bytes, bucket_nbytes: int) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    """Parse a header from :func:`encode_header` into ``(name, dtype, shape, offset)`` tuples.

    Raises:
        BucketHeaderError: bytes that are not the expected JSON list, an unknown dtype, or a tensor whose
            ``offset + nbytes`` exceeds ``bucket_nbytes``.
    """
    try:
        entries = json.loads(raw.decode("utf-8"))
        parsed = [
            (str(e["name"]), _dtype(e["dtype"]), tuple(int(d) for d in e["shape"]), int(e["offset"])) for e in entries
        ]
    except BucketHeaderError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise BucketHeaderError(f"bucket header: cannot decode {len(raw)} bytes ({exc})") from exc
    for name, dtype, shape, offset in parsed:
        end = offset + entry_nbytes(dtype, shape)
        if offset < 0 or end > bucket_nbytes:
            raise BucketHeaderError(
                f"bucket header: {name!r} spans bytes [{offset}, {end}) of a {bucket_nbytes}-byte bucket"
            )
    return parsed


def unpack_bucket(
    bucket: torch.Tensor, entries: Sequence[tuple[str, torch.dtype, tuple[int, ...], int]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` views into ``bucket`` (1-D ``uint8``) for each header entry; no copy.

    The views alias ``bucket``: consumers must copy them before the bucket buffer is reused.
    """
    for name, dtype, shape, offset in entries:
        raw = bucket[offset : offset + entry_nbytes(dtype, shape)]
        yield name, raw.view(dtype).reshape(shape)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """Flat ``uint8`` view of ``tensor``'s payload (a contiguous copy first if it is not contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8)
