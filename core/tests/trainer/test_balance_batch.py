"""trainer.balance_batch: equal-size partitions with balanced token sums, applied as one reorder."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.balance import balance_batch, balanced_partitions


def _best_spread(seqlens: list[int], k: int) -> int:
    """Brute force over every equal-size 2-way split (the oracle for small inputs)."""
    assert k == 2
    n = len(seqlens)
    total = sum(seqlens)
    best = total
    for combo in itertools.combinations(range(n), n // 2):
        a = sum(seqlens[i] for i in combo)
        best = min(best, abs(total - 2 * a))
    return best


def test_partitions_are_a_permutation_of_equal_sizes() -> None:
    seqlens = [5, 1, 9, 3, 7, 2, 8, 4]
    parts = balanced_partitions(seqlens, 4)
    assert [len(p) for p in parts] == [2, 2, 2, 2]
    assert sorted(i for p in parts for i in p) == list(range(8))
    # Longest-first (total 39): 9,8,7,5 open the four partitions, then 4->5's, 3->7's, 2->8's, 1->9's.
    assert sorted(sum(seqlens[i] for i in p) for p in parts) == [9, 10, 10, 10]


@pytest.mark.parametrize("seed", range(5))
def test_two_way_split_is_close_to_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    seqlens = rng.integers(10, 200, size=10).tolist()
    parts = balanced_partitions(seqlens, 2)
    spread = abs(sum(seqlens[i] for i in parts[0]) - sum(seqlens[i] for i in parts[1]))
    assert spread <= _best_spread(seqlens, 2) + max(seqlens) // 3 + 1


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="5 rows cannot be split into 2 equal partitions"):
        balanced_partitions([1] * 5, 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        balanced_partitions([1], 0)


def test_balance_batch_reorders_rows_and_reports_verl_metrics() -> None:
    # Rows 0-1 long, rows 2-3 short: the contiguous halves are (20, 4) tokens, balanced (12, 12).
    mask = torch.tensor([[1] * 10, [1] * 10, [1, 1, 0, 0, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]])
    data = DataProto.from_dict(
        tensors={"attention_mask": mask, "row": torch.arange(4)}, non_tensors={"uid": np.array(list("abcd"))}
    )
    metrics = balance_batch(data, 2)
    assert metrics["global_seqlen/min"] == 4 and metrics["global_seqlen/max"] == 20
    assert metrics["global_seqlen/minmax_diff"] == 16 and metrics["global_seqlen/mean"] == 12
    assert metrics["global_seqlen/balanced_min"] == 12 and metrics["global_seqlen/balanced_max"] == 12
    assert data.batch["row"].tolist() == [0, 2, 1, 3]
    assert data.non_tensor_batch["uid"].tolist() == ["a", "c", "b", "d"]  # rows move with their uid
