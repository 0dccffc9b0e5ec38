"""``trainer.balance_batch``: reorder a batch so every data-parallel rank gets about the same tokens.

``DP_COMPUTE_PROTO`` hands rank ``r`` the ``r``-th contiguous chunk of the batch, so the slowest rank
(the one with the most tokens) sets the pace of every stage. verl reorders rows once per step,
right after generation (``RayPPOTrainer._balance_batch``, verl/trainer/ppo/ray_trainer.py), into
``world_size`` equal-size partitions of balanced total length. Partitioning is NP-hard; verl uses
Karmarkar-Karp, this module the greedy longest-first rule (each row, longest first, goes to the
open partition with the fewest tokens), which is within 4/3 of optimal and exact enough for
batches of equal-size groups.
"""

from __future__ import annotations

from typing import Any

import torch


def balanced_partitions(seqlens: list[int], k: int) -> list[list[int]]:
    """Split row indices into ``k`` partitions of equal size with balanced length sums.

    Args:
        seqlens: token count of each row (``len`` must be divisible by ``k``).
        k: number of partitions (data-parallel ranks), >= 1.

    Returns:
        ``k`` lists of row indices, each sorted ascending, together a permutation of ``range(len)``.

    Raises:
        ValueError: ``k < 1`` or ``len(seqlens)`` not divisible by ``k``.
    """
    if k < 1:
        raise ValueError(f"balanced_partitions: k must be >= 1, got {k}")
    if len(seqlens) % k:
        raise ValueError(f"balanced_partitions: {len(seqlens)} rows cannot be split into {k} equal partitions")
    size = len(seqlens) // k
    parts: list[list[int]] = [[] for _ in range(k)]
    sums = [0] * k
    # Ties broken by index so the result is deterministic.
    for idx in sorted(range(len(seqlens)), key=lambda i: (-seqlens[i], i)):
        open_parts = [p for p in range(k) if len(parts[p]) < size]
        target = min(open_parts, key=lambda p: (sums[p], p))
        parts[target].append(idx)
        sums[target] += seqlens[idx]
    return [sorted(p) for p in parts]


def balance_batch(batch: Any, world_size: int) -> dict[str, float]:
    """Reorder ``batch`` in place so rank ``r``'s chunk is balanced partition ``r``; returns metrics.

    Args:
        batch: DataProto with ``attention_mask`` ``(bs, seq_len)``; ``bs`` divisible by ``world_size``.
        world_size: data-parallel ranks.

    Returns:
        verl's ``global_seqlen/{min,max,minmax_diff,balanced_min,balanced_max,mean}`` (tokens per rank,
        before and after balancing).
    """
    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    size = len(seqlens) // world_size
    before = [sum(seqlens[r * size : (r + 1) * size]) for r in range(world_size)]
    parts = balanced_partitions(seqlens, world_size)
    after = [sum(seqlens[i] for i in p) for p in parts]
    batch.reorder(torch.tensor([i for p in parts for i in p], dtype=torch.long))
    return {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": float(sum(before) / world_size),
    }
