"""Resharding trainer weights into the rollout's layout, streamed in buckets, without gathering whole tensors.

The trainer holds each weight either whole on every rank (the reference engine, replicated buffers) or split
along dim 0 over the ranks (FSDP2's ``Shard(0)`` DTensors, HSDP's ``(Replicate, Shard(0))``). The rollout
wants, on rank ``r``, the slice :meth:`WeightLayout.slice_for` names (a TP shard: rows of a column-parallel
weight, columns of a row-parallel one, or the whole tensor). Every rank computes the same transfer plan from
global shapes alone: for each receiver and each dim-0 chunk it needs, the rank holding that chunk (the one
in the receiver's own replica of the mesh) sends the intersection of its rows with the receiver's slice.
A bucket of weights moves in one ``all_to_all_single`` of raw bytes (gloo, nccl and hccl all implement it);
pieces a rank holds for itself are views, never copied.

Memory: per bucket a rank allocates its send buffer (the pieces it owes others) and its receive buffer (the
pieces of its own slices it lacks), then one concatenated slice at a time; a bucket closes before any rank's
``send + receive`` bytes would pass ``bucket_bytes`` (a single weight whose exchange is larger goes alone). So
the extra memory of a sync is at most ``max(bucket_bytes, the largest single weight's exchange)`` plus two
slices (the one being assembled and the previous one, until the consumer lets go of it), plus whatever the
consumer keeps: no rank ever holds a whole sharded tensor unless its own slice is the whole tensor (TP=1).

Weights on layouts this plan cannot express (sharded on another dim, a mesh that does not span the group,
partial placements) fall back to ``DTensor.full_tensor()`` for that weight, counted in ``full_gathers``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import torch

from verl.engines.weight_sync.buckets import ALIGN, align_up
from verl.engines.weight_sync.layout import ShardSlice, WeightLayout, layout_digest

logger = logging.getLogger(__name__)


class LayoutMismatchError(RuntimeError):
    """Ranks disagree on the weights or the layout of a sync (different names, shapes or layouts)."""


@attrs.define
class _Entry:
    """One weight: global shape, dim-0 chunks across ranks, and this rank's part."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    local: torch.Tensor  # this rank's chunk (sharded) or the whole tensor (replicated)
    chunks: list[tuple[int, int]]  # dim-0 row ranges; one entry [(0, N)] when replicated
    holders: Any  # holders(receiver, chunk) -> rank holding that chunk (receiver itself when replicated)
    my_chunk: int  # chunk index of `local`
    full_gather: bool = False

    @property
    def replicated(self) -> bool:
        return len(self.chunks) == 1 and self.holders is None


@attrs.frozen
class _Piece:
    """Rows ``[lo, hi)`` of chunk ``chunk`` (chunk-local numbering), restricted to ``target``'s other dims."""

    chunk: int
    src: int
    lo: int
    hi: int
    shape: tuple[int, ...]
    nbytes: int


def _element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _entry(name: str, tensor: torch.Tensor, rank: int, world: int) -> _Entry:
    """Describe ``tensor`` as chunks; unsupported DTensor placements are gathered whole (``full_gather``)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        local = tensor.detach()
        return _Entry(name, tuple(local.shape), local.dtype, local, [(0, _rows(local.shape))], None, 0)
    placements = tuple(tensor.placements)
    mesh = tensor.device_mesh
    grid = mesh.mesh
    spans_world = sorted(int(r) for r in grid.flatten().tolist()) == list(range(world))
    shard_dims = [k for k, p in enumerate(placements) if p.is_shard()]
    simple = (
        spans_world
        and len(tensor.shape) > 0
        and all(p.is_shard() or p.is_replicate() for p in placements)
        and len(shard_dims) <= 1
        and all(
            getattr(placements[k], "dim", None) == 0 and type(placements[k]).__name__ == "Shard" for k in shard_dims
        )
    )
    shape = tuple(tensor.shape)
    if not simple:
        full = tensor.full_tensor().detach()
        return _Entry(name, shape, full.dtype, full, [(0, _rows(shape))], None, 0, full_gather=True)
    local = tensor.to_local().detach()
    if not shard_dims:
        return _Entry(name, shape, local.dtype, local, [(0, shape[0])], None, 0)
    k = shard_dims[0]
    n = int(grid.shape[k])
    rows = shape[0]
    size = -(-rows // n)  # torch.chunk semantics (FSDP2 and DTensor Shard): ceil-sized, trailing chunks short/empty
    chunks = [(min(i * size, rows), min((i + 1) * size, rows)) for i in range(n)]
    coords = {int(grid[idx]): idx for idx in _indices(grid.shape)}

    def holders(receiver: int, chunk: int, _k: int = k) -> int:
        coord = list(coords[receiver])
        coord[_k] = chunk
        return int(grid[tuple(coord)])

    my_chunk = coords[rank][k]
    if local.shape[0] != chunks[my_chunk][1] - chunks[my_chunk][0]:
        full = tensor.full_tensor().detach()
        return _Entry(name, shape, full.dtype, full, [(0, rows)], None, 0, full_gather=True)
    return _Entry(name, shape, local.dtype, local, chunks, holders, my_chunk)


def _rows(shape: Sequence[int]) -> int:
    return int(shape[0]) if len(shape) else 1


def _indices(shape: Sequence[int]) -> Iterator[tuple[int, ...]]:
    if not shape:
        yield ()
        return
    for i in range(int(shape[0])):
        for rest in _indices(shape[1:]):
            yield (i, *rest)


def _pieces(entry: _Entry, target: ShardSlice | None, receiver: int) -> list[_Piece]:
    """The pieces ``receiver`` needs of ``entry``, in row order, with their holders."""
    itemsize = entry.dtype.itemsize
    if len(entry.shape) == 0:  # a scalar is always whole on every rank
        return [_Piece(0, receiver, 0, 1, (), itemsize)]
    out: list[_Piece] = []
    for i, (a, b) in enumerate(entry.chunks):
        lo, hi = a, b
        if target is not None and target.dim == 0:
            lo, hi = max(a, target.start), min(b, target.stop)
        if hi <= lo:
            continue
        shape = list(entry.shape)
        shape[0] = hi - lo
        if target is not None and target.dim != 0:
            shape[target.dim] = target.length
        src = receiver if entry.holders is None else entry.holders(receiver, i)
        out.append(_Piece(i, src, lo - a, hi - a, tuple(shape), _element_count(shape) * itemsize))
    return out


def _view(local: torch.Tensor, piece: _Piece, target: ShardSlice | None) -> torch.Tensor:
    """The piece cut out of the holder's local chunk (a view)."""
    if len(piece.shape) == 0:
        return local
    view = local.narrow(0, piece.lo, piece.hi - piece.lo)
    if target is not None and target.dim != 0:
        view = view.narrow(target.dim, target.start, target.length)
    return view


@attrs.define
class ReshardStats:
    """What one sync moved on this rank (bytes: ``numel * element_size``).

    Attributes:
        tensors: weights yielded; bytes: their bytes; sent_bytes / received_bytes: bytes that crossed ranks;
        buckets: ``all_to_all`` rounds; peak_buffer_bytes: largest send + receive + assembled-slice bytes held
        at once; full_gathers: weights gathered whole (unsupported placements); skipped_tied: weights not sent
        because they alias an earlier one (tied embeddings).
    """

    tensors: int = 0
    bytes: int = 0
    sent_bytes: int = 0
    received_bytes: int = 0
    buckets: int = 0
    peak_buffer_bytes: int = 0
    full_gathers: int = 0
    skipped_tied: int = 0

    def as_metrics(self) -> dict[str, int]:
        return attrs.asdict(self)


def _dedupe(weights: Iterable[tuple[str, torch.Tensor]], stats: ReshardStats) -> list[tuple[str, torch.Tensor]]:
    from torch.distributed.tensor import DTensor

    seen: set[tuple[Any, ...]] = set()
    out = []
    for name, tensor in weights:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.numel() > 0:
            key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(tensor.shape), local.dtype)
            if key in seen:
                stats.skipped_tied += 1
                continue
            seen.add(key)
        out.append((name, tensor))
    return out


def reshard_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    layout: WeightLayout,
    *,
    bucket_bytes: int,
    device: torch.device | str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    stats: ReshardStats | None = None,
    dedupe_tied: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, this rank's slice)`` of every weight, in order; collective over the default group.

    Every rank passes the same names in the same order (its own view of each: a DTensor shard or the whole
    tensor). The yielded tensors have ``layout.slice_for(name, shape, rank).shape_of(shape)`` (or the full
    shape) and the trainer's dtype; they are views into this rank's weights or into a receive buffer, valid
    until the generator resumes: copy them before asking for the next one.

    Args:
        weights: ``(hf_name, tensor)`` pairs (e.g. a training engine's state dict); tensors are only read.
        layout: the rollout's :class:`WeightLayout`; its ``world_size`` must equal the group's.
        bucket_bytes: cap of one bucket's send + receive bytes on any rank (>= 1).
        device: where communication buffers live (``cpu`` for gloo); default the first tensor's device.
        rank / world_size: default ``torch.distributed``'s (0 / 1 when it is not initialised).
        stats: filled in as the generator runs (:class:`ReshardStats`).
        dedupe_tied: skip a weight that aliases an earlier one (tied embeddings: the rollout ties them too).

    Raises:
        ValueError: ``layout.world_size`` differs from the group's world size, or ``bucket_bytes < 1``.
        LayoutMismatchError: ranks passed different weights or layouts (compared by digest first).
    """
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    world = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
    me = rank if rank is not None else (dist.get_rank() if initialised else 0)
    if layout.world_size != world:
        raise ValueError(
            f"rollout weight layout spans {layout.world_size} ranks but the trainer's group has {world}: the rollout "
            "and the training engine must share the world in hybrid mode"
        )
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    stats = stats if stats is not None else ReshardStats()
    pairs = _dedupe(weights, stats) if dedupe_tied else list(weights)
    if world > 1:
        _check_same_everywhere(pairs, layout, world)
    entries = [_entry(name, tensor, me, world) for name, tensor in pairs]
    stats.full_gathers += sum(e.full_gather for e in entries)
    if device is None:
        device = entries[0].local.device if entries else torch.device("cpu")
    buckets = _plan_buckets(entries, layout, world, bucket_bytes)
    # One exchange buffer for the whole sync, reused by every bucket (each all_to_all completes before the
    # next bucket is packed): the sync's memory does not depend on when the backend lets go of a buffer.
    need = max((_exchange_bytes(bucket, me, world) for bucket in buckets), default=0)
    buffer = torch.empty(need, dtype=torch.uint8, device=torch.device(device))
    stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, need)
    for bucket in buckets:
        yield from _flush(bucket, me, world, buffer, stats)


_Bucket = list[tuple[_Entry, list[list[_Piece]], list[ShardSlice | None]]]


def _plan_buckets(entries: list[_Entry], layout: WeightLayout, world: int, bucket_bytes: int) -> list[_Bucket]:
    """Group weights in order; a bucket closes before any rank's send + receive bytes would pass the cap."""
    buckets: list[_Bucket] = []
    bucket: _Bucket = []
    cost = [0] * world
    for entry in entries:
        targets = [layout.slice_for(entry.name, entry.shape, r) for r in range(world)]
        plan = [_pieces(entry, targets[r], r) for r in range(world)]
        add = [0] * world
        for receiver, pieces in enumerate(plan):
            for p in pieces:
                if p.src != receiver:
                    add[receiver] += align_up(p.nbytes)
                    add[p.src] += align_up(p.nbytes)
        if bucket and max(c + a for c, a in zip(cost, add, strict=True)) > bucket_bytes:
            buckets.append(bucket)
            bucket, cost = [], [0] * world
        bucket.append((entry, plan, targets))
        cost = [c + a for c, a in zip(cost, add, strict=True)]
    if bucket:
        buckets.append(bucket)
    return buckets


def _segments(bucket: _Bucket, me: int, world: int) -> tuple[list[int], list[int], list, dict]:
    """This rank's send / receive segment sizes (aligned) and where each crossing piece goes in them."""
    send_sizes, recv_sizes = [0] * world, [0] * world
    send_at: list[tuple[int, int, _Piece, _Entry, ShardSlice | None]] = []  # (dest, offset, piece, ...)
    recv_at: dict[tuple[int, int], tuple[int, int]] = {}  # (entry idx, chunk) -> (src, offset)
    for index, (entry, plan, targets) in enumerate(bucket):
        for receiver, pieces in enumerate(plan):
            for p in pieces:
                if p.src == receiver:
                    continue
                if p.src == me:
                    offset = align_up(send_sizes[receiver])
                    send_sizes[receiver] = offset + p.nbytes
                    send_at.append((receiver, offset, p, entry, targets[receiver]))
                if receiver == me:
                    offset = align_up(recv_sizes[p.src])
                    recv_sizes[p.src] = offset + p.nbytes
                    recv_at[(index, p.chunk)] = (p.src, offset)
    return [align_up(x) for x in send_sizes], [align_up(x) for x in recv_sizes], send_at, recv_at


def _exchange_bytes(bucket: _Bucket, me: int, world: int) -> int:
    """Bytes of this rank's send + receive segments for ``bucket``."""
    send_sizes, recv_sizes, _, _ = _segments(bucket, me, world)
    return sum(send_sizes) + sum(recv_sizes)


def _check_same_everywhere(pairs: list[tuple[str, torch.Tensor]], layout: WeightLayout, world: int) -> None:
    import torch.distributed as dist

    digest = layout_digest(layout, [(name, tuple(t.shape)) for name, t in pairs])
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, (digest, len(pairs)))
    if len(set(digests)) > 1:
        raise LayoutMismatchError(
            f"weight sync: ranks disagree on the weights or the rollout layout (digest, count per rank: {digests}); "
            "every rank must build the same rollout config and model"
        )


def _flush(
    bucket: _Bucket, me: int, world: int, buffer: torch.Tensor, stats: ReshardStats
) -> Iterator[tuple[str, torch.Tensor]]:
    send_sizes, recv_sizes, send_at, recv_at = _segments(bucket, me, world)
    moved = any(p.src != receiver for _, plan, _ in bucket for receiver, pieces in enumerate(plan) for p in pieces)
    send = buffer[: sum(send_sizes)]
    recv = buffer[sum(send_sizes) : sum(send_sizes) + sum(recv_sizes)]
    recv_base = [sum(recv_sizes[:src]) for src in range(world)]
    if moved:  # every rank knows whether any rank exchanges something in this bucket
        import torch.distributed as dist

        send_base = [sum(send_sizes[:d]) for d in range(world)]
        for dest, offset, p, entry, target in send_at:
            start = send_base[dest] + offset
            send[start : start + p.nbytes].view(entry.dtype).view(p.shape).copy_(_view(entry.local, p, target))
        dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
        stats.buckets += 1
        stats.sent_bytes += sum(p.nbytes for _, _, p, _, _ in send_at)
    for index, (entry, plan, targets) in enumerate(bucket):
        parts = []
        for p in plan[me]:
            if p.src == me:
                parts.append(_view(entry.local, p, targets[me]).to(buffer.device))
                continue
            src, offset = recv_at[(index, p.chunk)]
            start = recv_base[src] + offset
            parts.append(recv[start : start + p.nbytes].view(entry.dtype).view(p.shape))
            stats.received_bytes += p.nbytes
        if not parts:
            piece = targets[me]
            out = entry.local.new_empty(entry.shape if piece is None else piece.shape_of(entry.shape))
        else:
            out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        if len(parts) > 1:
            stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, buffer.numel() + out.numel() * out.element_size())
        stats.tensors += 1
        stats.bytes += out.numel() * out.element_size()
        yield entry.name, out
        del out, parts


__all__ = ["ALIGN", "LayoutMismatchError", "ReshardStats", "reshard_weights"]
