"""Resharding trainer weights into the rollout's layout, streamed in buckets, without gathering whole tensors.

The trainer holds each weight either whole on every rank (the reference engine, replicated buffers) or split
along dim 0 over the ranks (FSDP2's ``Shard(0)`` DTensors, HSDP's ``(Replicate, Shard(0))``). The rollout
wants, on rank ``r``, the slice :meth:`WeightLayout.slice_for` names (a TP shard: rows of a column-parallel
weight, columns of a row-parallel one, or the whole tensor). Every rank computes the same transfer plan from
global shapes alone: for each receiver and each dim-0 chunk it needs, the rank holding that chunk (the one
in the receiver's own replica of the mesh) sends the intersection of its rows with the receiver's slice.

The pieces move point to point (``batch_isend_irecv``; gloo, nccl and hccl implement it), straight into the
slice being assembled: each piece is a block of consecutive rows of the slice, so it is received into a
view of the output and nothing is concatenated. A piece is sent from a view of the sender's shard (copied
first only when it is not contiguous: the column block of a row-parallel weight). A slice the rank holds
entirely itself is a view of its shard, never copied.

Memory: a bucket's slices are allocated together, and the generator lets go of each as it yields it (the
consumer copies it and drops it); a bucket closes before any rank's
``received slices + send copies`` would pass ``bucket_bytes`` (a weight that alone is larger goes alone). So
the extra memory of a sync is at most ``max(bucket_bytes, the largest single weight's cost)`` plus the last
slice the consumer still holds: no rank ever holds a whole sharded tensor unless its own slice is the whole
tensor (TP=1), where the cost equals ``DTensor.full_tensor``'s.

Weights on layouts this plan cannot express (sharded on another dim, a mesh that does not span the group,
partial placements) fall back to ``DTensor.full_tensor()`` for that weight, counted in ``full_gathers``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import torch

from verl.engines.weight_sync.layout import ShardSlice, WeightLayout, layout_digest


class LayoutMismatchError(RuntimeError):
    """Ranks disagree on the weights or the layout of a sync (different names, shapes or layouts)."""


@attrs.define
class _Entry:
    """One weight: global shape, dim-0 chunks across ranks, and this rank's part."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    local: torch.Tensor | None  # this rank's chunk (sharded) or the whole tensor (replicated); None until gathered
    chunks: list[tuple[int, int]]  # dim-0 row ranges; one entry [(0, N)] when replicated
    holders: Any  # holders(receiver, chunk) -> rank holding that chunk (receiver itself when replicated)
    my_chunk: int  # chunk index of `local`
    full_gather: bool = False
    source: Any = None  # the DTensor to gather whole, when its layout cannot be resharded (full_gather)

    def gathered(self) -> None:
        """For a ``full_gather`` weight: gather it now (collective: every rank does it at the same point)."""
        if self.local is None:
            self.local = self.source.full_tensor().detach()

    def as_full_gather(self) -> _Entry:
        """This weight, to be gathered whole when its bucket comes (instead of resharded)."""
        return _Entry(self.name, self.shape, self.dtype, None, [(0, _rows(self.shape))], None, 0, True, self.source)


@attrs.frozen
class _Piece:
    """Rows ``[lo, hi)`` of chunk ``chunk`` (chunk-local numbering), restricted to ``target``'s other dims."""

    chunk: int
    src: int
    lo: int
    hi: int
    shape: tuple[int, ...]
    nbytes: int


def _entry(name: str, tensor: torch.Tensor, rank: int, world: int) -> tuple[_Entry, bool]:
    """Describe ``tensor`` as chunks, and whether this rank's part is what the chunking says (``ok``).

    Placements the plan cannot express (decided from the DTensor's global metadata, so alike on every rank)
    become ``full_gather`` entries; a local shard of an unexpected size makes ``ok`` False, which the caller
    reconciles over the ranks before anything moves.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        local = tensor.detach()
        return _Entry(name, tuple(local.shape), local.dtype, local, [(0, _rows(local.shape))], None, 0), True
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
    whole = _Entry(name, shape, tensor.dtype, None, [(0, _rows(shape))], None, 0, True, tensor)
    if not simple:
        return whole, True
    local = tensor.to_local().detach()
    if not shard_dims:
        return _Entry(name, shape, local.dtype, local, [(0, shape[0])], None, 0, source=tensor), True
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
    ok = local.shape[0] == chunks[my_chunk][1] - chunks[my_chunk][0]
    return _Entry(name, shape, local.dtype, local, chunks, holders, my_chunk, source=tensor), ok


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
        out.append(_Piece(i, src, lo - a, hi - a, tuple(shape), math.prod(shape) * itemsize))
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
        buckets: exchange rounds (buckets with something to send or receive); peak_buffer_bytes: the largest
        bucket's allocations (assembled slices + send copies); full_gathers: weights gathered whole
        (unsupported placements); skipped_tied: weights not sent because they alias an earlier one (tied
        embeddings).
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
        """The counters as a ``{name: int}`` dict (the sync's ``weight_sync/<name>`` metrics)."""
        return attrs.asdict(self)


def tied_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two state-dict entries one tensor (tied weights): the same storage, offset, shape and dtype
    of this rank's part; None for an empty tensor (never deduplicated)."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    if local.numel() == 0:
        return None
    return (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(tensor.shape), local.dtype)


def dedupe_tied(weights: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """``weights`` without entries that alias an earlier one (:func:`tied_key`), and how many were dropped."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    skipped = 0
    for name, tensor in weights:
        key = tied_key(tensor)
        if key is not None and key in seen:
            skipped += 1
            continue
        if key is not None:
            seen.add(key)
        out.append((name, tensor))
    return out, skipped


def reshard_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    layout: WeightLayout,
    *,
    bucket_bytes: int,
    device: torch.device | str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    stats: ReshardStats | None = None,
    dedupe: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, this rank's slice)`` of every weight, in order; collective over the default group.

    Every rank passes the same names in the same order (its own view of each: a DTensor shard or the whole
    tensor). The yielded tensors have ``layout.slice_for(name, shape, rank).shape_of(shape)`` (or the full
    shape) and the trainer's dtype; they are fresh slices or views of this rank's own weights: copy them,
    and do not write into them.

    Args:
        weights: ``(hf_name, tensor)`` pairs (e.g. a training engine's state dict); tensors are only read.
        layout: the rollout's :class:`WeightLayout`; its ``world_size`` must equal the group's.
        bucket_bytes: cap of one bucket's allocations on any rank (>= 1): received slices + send copies.
        device: where slices are assembled and sent from (``cpu`` for gloo); default the first tensor's device.
        rank / world_size: default ``torch.distributed``'s (0 / 1 when it is not initialised).
        stats: filled in as the generator runs (:class:`ReshardStats`).
        dedupe: skip a weight that aliases an earlier one (tied embeddings: the rollout ties them too).

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
    if dedupe:
        pairs, skipped = dedupe_tied(weights)
        stats.skipped_tied += skipped
    else:
        pairs = list(weights)
    if world > 1:
        _check_same_everywhere(pairs, layout, world)
    described = [_entry(name, tensor, me, world) for name, tensor in pairs]
    if device is None:
        first = next((e.local for e, _ in described if e.local is not None), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    entries = [e for e, _ in described]
    if world > 1 and entries:
        # A shard of an unexpected size on any rank sends that weight down the whole-gather path on every
        # rank: the ranks must agree on the plan, or their sends and receives would not match.
        ok = torch.tensor([int(good) for _, good in described], dtype=torch.int32, device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        entries = [e if good else e.as_full_gather() for e, good in zip(entries, ok.tolist(), strict=True)]
    stats.full_gathers += sum(e.full_gather for e in entries)
    for bucket in _plan_buckets(entries, layout, world, me, bucket_bytes):
        yield from _flush(bucket, me, world, device, stats)


_Bucket = list[tuple[_Entry, list[list[_Piece]], list[ShardSlice | None]]]


def _zero_copy(pieces: list[_Piece], receiver: int) -> bool:
    """The receiver holds its whole slice itself (one local piece): a view, no allocation."""
    return len(pieces) == 1 and pieces[0].src == receiver


def _cost(entry: _Entry, plan: list[list[_Piece]], targets: list[ShardSlice | None], world: int) -> list[int]:
    """Bytes each rank allocates for ``entry``: its assembled slice (unless zero-copy) + non-contiguous send copies."""
    cost = [0] * world
    if entry.full_gather:  # every rank holds the gathered whole tensor while its bucket is consumed
        whole = math.prod(entry.shape) * entry.dtype.itemsize
        cost = [whole] * world
    for receiver, pieces in enumerate(plan):
        if not _zero_copy(pieces, receiver):
            cost[receiver] += sum(p.nbytes for p in pieces)
        for p in pieces:
            target = targets[receiver]
            if p.src != receiver and target is not None and target.dim != 0:
                cost[p.src] += p.nbytes  # a column block: copied to be sent
    return cost


def _plan_buckets(
    entries: list[_Entry], layout: WeightLayout, world: int, me: int, bucket_bytes: int
) -> Iterator[_Bucket]:
    """Group weights in order; a bucket closes before any rank's allocations would pass the cap."""
    bucket: _Bucket = []
    cost = [0] * world
    for entry in entries:
        targets = [layout.slice_for(entry.name, entry.shape, r) for r in range(world)]
        plan = [_pieces(entry, targets[r], r) for r in range(world)]
        add = _cost(entry, plan, targets, world)
        if bucket and max(c + a for c, a in zip(cost, add, strict=True)) > bucket_bytes:
            yield bucket
            bucket, cost = [], [0] * world
        bucket.append((entry, plan, targets))
        cost = [c + a for c, a in zip(cost, add, strict=True)]
    if bucket:
        yield bucket


def _check_same_everywhere(pairs: list[tuple[str, torch.Tensor]], layout: WeightLayout, world: int) -> None:
    import torch.distributed as dist

    digest = layout_digest(
        layout, [(f"{name}:{t.dtype}:{getattr(t, 'placements', 'local')}", tuple(t.shape)) for name, t in pairs]
    )
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, (digest, len(pairs)))
    if len(set(digests)) > 1:
        raise LayoutMismatchError(
            f"weight sync: ranks disagree on the weights or the rollout layout (digest, count per rank: {digests}); "
            "every rank must build the same rollout config and model"
        )


def _flush(
    bucket: _Bucket, me: int, world: int, device: torch.device, stats: ReshardStats
) -> Iterator[tuple[str, torch.Tensor]]:
    """Exchange one bucket (every rank posts the same sends and receives, pair by pair in plan order)."""
    import torch.distributed as dist

    outs: list[torch.Tensor | None] = []
    ops: list[Any] = []
    allocated = 0
    for tag, (entry, plan, targets) in enumerate(bucket):
        if entry.full_gather:
            entry.gathered()
        mine, target = plan[me], targets[me]
        shape = entry.shape if target is None else target.shape_of(entry.shape)
        if _zero_copy(mine, me):
            out = _view(entry.local, mine[0], target)
            if out.device != device:  # e.g. shards kept on the host (offload_policy) for a device rollout
                out = out.to(device)
                allocated += out.numel() * out.element_size()
        else:
            out = torch.empty(shape, dtype=entry.dtype, device=device)
            allocated += out.numel() * out.element_size()
            row = 0
            for p in mine:
                rows = p.hi - p.lo
                dst = out.narrow(0, row, rows) if len(shape) else out
                if p.src == me:
                    dst.copy_(_view(entry.local, p, target))
                else:
                    ops.append(dist.P2POp(dist.irecv, dst, p.src, tag=tag))
                    stats.received_bytes += p.nbytes
                row += rows
        outs.append(out)
        for receiver in range(world):
            if receiver == me:
                continue
            for p in plan[receiver]:
                if p.src != me:
                    continue
                piece = _view(entry.local, p, targets[receiver])
                if not piece.is_contiguous() or piece.device != device:
                    piece = piece.to(device).contiguous()
                    allocated += piece.numel() * piece.element_size()
                ops.append(dist.P2POp(dist.isend, piece, receiver, tag=tag))
                stats.sent_bytes += p.nbytes
    stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, allocated)
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        stats.buckets += 1
    del ops
    for index, (entry, _, _) in enumerate(bucket):
        out, outs[index] = outs[index], None  # the generator keeps no reference once the consumer has it
        stats.tensors += 1
        stats.bytes += out.numel() * out.element_size()
        yield entry.name, out
        del out
        if entry.full_gather:
            entry.local = None


__all__ = ["LayoutMismatchError", "ReshardStats", "dedupe_tied", "reshard_weights", "tied_key"]
