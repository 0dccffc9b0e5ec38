"""Rollout-correction IS weights: verl's per-row fractions for rollout_is=sequence, and the all-rank
batch normalisation (verl's distributed_masked_mean) on 2 gloo ranks vs one process on the whole batch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from verl.algorithms.rollout_correction import compute_rollout_correction_weights
from verl.testing.distributed import load_script, run_ranks

HERE = Path(__file__).parent
SC = load_script(HERE / "rollout_corr_ranks.py")


def t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# Σ log-ratio per row: 1.5 (> log 2), -1.0 (< log 0.5), 0.2, and 0 for the empty last row.
LOG_RATIO = t([[0.5, 0.5, 0.5], [-1.0, 0.0, 0.0], [0.1, 0.1, 0.0], [0.0, 0.0, 0.0]])
MASK = t([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])


def test_sequence_fractions_count_rows_as_verl_does():
    _, metrics = compute_rollout_correction_weights(LOG_RATIO, MASK, rollout_is="sequence", rollout_is_threshold=2.0)
    # One row of four above, one below (verl: mean over rows); weighting by tokens would give 3/6 and 1/6.
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(0.25)
    assert metrics["rollout_is_ratio_fraction_low"] == pytest.approx(0.25)


def test_token_fractions_stay_per_valid_token():
    _, metrics = compute_rollout_correction_weights(LOG_RATIO, MASK, rollout_is="token", rollout_is_threshold=1.5)
    # Raw weights e^0.5 = 1.65 (3 tokens) > 1.5; e^-1 = 0.37 < 1/1.5 (1 token); 6 valid tokens.
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(3 / 6)
    assert metrics["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 6)


def test_sequence_fraction_uses_the_unclamped_log_ratio():
    # Σ = 25 > log(1e10) = 23.03, while the clamped weight e^20 = 4.9e8 is inside the IcePop band.
    log_ratio = t([[5.0] * 5, [0.0] * 5])
    _, metrics = compute_rollout_correction_weights(
        log_ratio, torch.ones(2, 5, dtype=torch.float64), rollout_is="sequence", rollout_is_threshold="0.5_1e10"
    )
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    assert metrics["rollout_is_ratio_fraction_low"] == 0.0


def test_single_process_batch_normalisation_by_hand():
    log_ratio, mask = SC.full_batch()
    weights, metrics = compute_rollout_correction_weights(
        log_ratio, mask, rollout_is="sequence", rollout_is_threshold=5.0, rollout_is_batch_normalize=True
    )
    row_w = [math.exp(0.8), math.exp(-0.4), math.exp(-0.1), math.exp(0.05)]
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx(sum(row_w) / 4)
    assert weights[0, 0].item() == pytest.approx(row_w[0] / (sum(row_w) / 4))


@pytest.mark.multiprocess
def test_batch_normalisation_averages_over_all_ranks(tmp_path):
    run_ranks(HERE / "rollout_corr_ranks.py", [str(tmp_path)], world_size=2, timeout_s=120)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    log_ratio, mask = SC.full_batch()
    for level in ("token", "sequence"):
        whole, whole_metrics = compute_rollout_correction_weights(
            log_ratio, mask, rollout_is=level, rollout_is_threshold=5.0, rollout_is_batch_normalize=True
        )
        for rank, rows in enumerate(SC.ROWS):
            weights, metrics = results[rank][level]
            torch.testing.assert_close(weights, whole[rows])
            assert metrics["rollout_is_batch_norm_factor"] == pytest.approx(
                whole_metrics["rollout_is_batch_norm_factor"]
            )
