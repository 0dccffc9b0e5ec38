"""Rank script for test_algo_rollout_correction.py: each gloo rank normalises the IS weights of its rows.

``python rollout_corr_ranks.py OUT_DIR`` under :func:`verl.testing.distributed.run_ranks` (2 ranks); rank r
takes ``ROWS[r]`` of :func:`full_batch` and saves ``OUT_DIR/rank{r}.pt`` with its weights and metrics.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from verl.algorithms.rollout_correction import compute_rollout_correction_weights

# Rank 0 holds 1 row of 4 tokens, rank 1 holds 3 rows of 1-2 tokens: per-rank means differ from the
# all-rank mean for both levels, so a rank-local average cannot pass the test.
ROWS = ([0], [1, 2, 3])


def full_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(log_ratio, response_mask), both (4, 4) float64."""
    log_ratio = torch.tensor(
        [[0.3, 0.2, 0.1, 0.2], [-0.4, 0.0, 0.0, 0.0], [0.1, -0.2, 0.0, 0.0], [0.05, 0.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    return log_ratio, mask


def run(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log_ratio, mask = full_batch()
    rows = ROWS[rank]
    result = {}
    for level in ("token", "sequence"):
        weights, metrics = compute_rollout_correction_weights(
            log_ratio[rows], mask[rows], rollout_is=level, rollout_is_threshold=5.0, rollout_is_batch_normalize=True
        )
        result[level] = (weights, metrics)
    torch.save(result, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
    os._exit(0)
