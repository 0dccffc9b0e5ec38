"""Rollout-correction importance weights and verl's rollout_is_* metrics, against numpy and by hand.

The numpy reference below restates verl's formulas (rollout_corr_helper.py: compute_rollout_correction_weights,
compute_is_metrics) on a batch with an empty row, so the row-counting conventions are pinned too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.algorithms.rollout_correction import (
    compute_is_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
)

# Log-ratios from e^-1.2 to e^0.9 per token; row sums from -1.5 to 1.6; row 3 is empty (its values are ignored).
LR = np.array(
    [[0.9, -0.3, 0.4, 0.6], [-1.2, 0.1, 7.0, -7.0], [0.5, 3.0, 3.0, 3.0], [2.0, 2.0, 2.0, 2.0], [-0.8, -0.5, -0.2, 9.0]]
)
MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=np.float64)


def t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def mm(x, m=MASK):
    return float((x * m).sum() / m.sum())


def row_mean(x, m=MASK):
    count = m.sum(-1)
    return np.where(count > 0, (x * m).sum(-1) / np.maximum(count, 1), 0.0)


def np_weights(lr, m, level, upper, lower=None):
    """(applied weights, raw weights, unclamped log-ratio used by the metrics)."""
    if level == "token":
        unclamped = lr
        raw = np.exp(np.clip(lr, -20, 20))
    else:
        unclamped = (lr * m).sum(-1, keepdims=True)
        raw = np.repeat(np.exp(np.clip(unclamped, -20, 20)), lr.shape[1], axis=1)
    raw = raw * m
    w = np.minimum(raw, upper) if lower is None else np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    return w, raw, unclamped


def np_metrics(lr, m, level, upper, lower=None):
    w, raw, unclamped = np_weights(lr, m, level, upper, lower)
    lo = 1.0 / upper if lower is None else lower
    valid = m > 0
    out = {"rollout_is_mean": mm(w, m)}
    if level == "sequence":
        out["rollout_is_max"] = math.exp(min(unclamped.max(), 20))
        out["rollout_is_min"] = math.exp(unclamped.min())
        out["rollout_is_ratio_fraction_high"] = float((unclamped > math.log(upper)).mean())
        out["rollout_is_ratio_fraction_low"] = float((unclamped < math.log(lo)).mean())
    else:
        out["rollout_is_max"] = float(w[valid].max())
        out["rollout_is_min"] = float(w[valid].min())
        out["rollout_is_ratio_fraction_high"] = mm(raw > upper, m)
        out["rollout_is_ratio_fraction_low"] = mm(raw < lo, m)
    c = np.clip(w, 0, upper)
    out["rollout_is_std"] = math.sqrt(max(mm(c**2, m) - mm(c, m) ** 2, 0.0))
    out["rollout_is_eff_sample_size"] = 1.0 / mm((c / (mm(c, m) + 1e-8)) ** 2, m)
    rows = row_mean(w, m)
    out["rollout_is_seq_mean"] = float(rows.mean())
    out["rollout_is_seq_std"] = float(rows.std(ddof=1))
    out["rollout_is_seq_max"] = float(rows.max())
    out["rollout_is_seq_min"] = float(rows.min())
    out["rollout_is_seq_max_deviation"] = float(np.abs(rows - 1).max())
    raw_rows = row_mean(raw, m)
    out["rollout_is_seq_fraction_high"] = float((raw_rows > upper).mean())
    out["rollout_is_seq_fraction_low"] = float((raw_rows < lo).mean())
    if lower is not None:
        out["rollout_is_oob_ratio"] = mm((raw < lower) | (raw > upper), m)
    return w, out


@pytest.mark.parametrize(
    ("level", "threshold", "upper", "lower"),
    [
        ("token", 1.5, 1.5, None),
        ("sequence", 2.0, 2.0, None),
        ("token", "0.7_1.6", 1.6, 0.7),
        ("sequence", "0.4_3", 3.0, 0.4),
    ],
)
def test_weights_and_every_metric_match_numpy(level, threshold, upper, lower):
    weights, metrics = compute_rollout_correction_weights(
        t(LR), t(MASK), rollout_is=level, rollout_is_threshold=threshold
    )
    expected_w, expected = np_weights(LR, MASK, level, upper, lower)[0], np_metrics(LR, MASK, level, upper, lower)[1]
    np.testing.assert_allclose(weights.numpy(), expected_w, rtol=1e-12)
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert not weights.requires_grad
    assert (weights.numpy()[MASK == 0] == 0).all()


def test_the_example_exercises_truncation_and_the_band():
    # Guards the parametrised test against a batch where TIS and IcePop would change nothing.
    w, raw, _ = np_weights(LR, MASK, "token", 1.5)
    assert (raw > 1.5).any() and (raw[MASK > 0] < 1 / 1.5).any()
    w, raw, _ = np_weights(LR, MASK, "token", 1.6, 0.7)
    assert ((w == 0) & (MASK > 0)).any() and (w > 0).any()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_batch_normalisation_rescales_to_mean_one(level):
    weights, metrics = compute_rollout_correction_weights(
        t(LR), t(MASK), rollout_is=level, rollout_is_threshold=2.0, rollout_is_batch_normalize=True
    )
    w, _, _ = np_weights(LR, MASK, level, 2.0)
    # token: mean over valid tokens; sequence: mean of the per-row weights over non-empty rows.
    factor = mm(w) if level == "token" else float(row_mean(w)[MASK.sum(-1) > 0].mean())
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx(factor, rel=1e-12)
    np.testing.assert_allclose(weights.numpy(), w / factor, rtol=1e-12)
    assert metrics["rollout_is_mean"] == pytest.approx(mm(w))  # the metrics describe the unnormalised weights


def test_token_icepop_by_hand():
    # raw weights 0.25, 1.0, 4.0 on three valid tokens; band [0.5, 2]: only 1.0 survives.
    lr = np.log([[0.25, 1.0, 4.0]])
    weights, metrics = compute_rollout_correction_weights(t(lr), t([[1, 1, 1]]), "token", "0.5_2")
    np.testing.assert_allclose(weights.numpy(), [[0.0, 1.0, 0.0]], atol=1e-12)
    assert metrics["rollout_is_oob_ratio"] == pytest.approx(2 / 3)
    assert metrics["rollout_is_mean"] == pytest.approx(1 / 3)
    assert metrics["rollout_is_std"] == pytest.approx(math.sqrt(1 / 3 - 1 / 9))  # weights 0, 1, 0
    assert metrics["rollout_is_eff_sample_size"] == pytest.approx(1 / 3)  # mean((w / (1/3))^2) = 3
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert metrics["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)


def test_sequence_truncation_by_hand():
    # Row sums of log-ratio: log 3 (weight 3, truncated to 2) and log 0.5; the second row has one token.
    lr = np.array([[math.log(3) / 2, math.log(3) / 2], [math.log(0.5), 5.0]])
    mask = np.array([[1, 1], [1, 0]])
    weights, metrics = compute_rollout_correction_weights(t(lr), t(mask), "sequence", 2.0)
    np.testing.assert_allclose(weights.numpy(), [[2.0, 2.0], [0.5, 0.0]], rtol=1e-12)
    assert metrics["rollout_is_max"] == pytest.approx(3.0)  # of the unclamped row weights
    assert metrics["rollout_is_min"] == pytest.approx(0.5)
    assert metrics["rollout_is_mean"] == pytest.approx(4.5 / 3)
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)
    assert metrics["rollout_is_ratio_fraction_low"] == 0.0  # 0.5 is not below 1/2
    assert metrics["rollout_is_seq_fraction_high"] == pytest.approx(0.5)  # raw row mean 3 > 2


def test_ess_of_all_zero_weights_is_zero_not_a_division_error():
    metrics = compute_is_metrics(
        t([[0.0, 0.0]]), t([[9.0, 9.0]]), t(np.log([[9.0, 9.0]])), t([[1, 1]]), "token", 2.0, 0.5
    )
    assert metrics["rollout_is_eff_sample_size"] == 0.0


def test_combined_function_prefixes_and_disables():
    old, roll = t(LR - 1.0), t(np.full_like(LR, -1.0))
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(old, roll, t(MASK), rollout_is=None)
    assert weights is None and torch.equal(mask, t(MASK))
    assert "rollout_corr/kl" in metrics and all(key.startswith("rollout_corr/") for key in metrics)
    assert not any(key.startswith("rollout_corr/rollout_is") for key in metrics)
    # verl: a null threshold turns the weights off too.
    weights, _, _ = compute_rollout_correction_and_rejection_mask(
        old, roll, t(MASK), rollout_is="token", rollout_is_threshold=None
    )
    assert weights is None
    weights, _, metrics = compute_rollout_correction_and_rejection_mask(old, roll, t(MASK), rollout_is="token")
    np.testing.assert_allclose(weights.numpy(), np_weights(LR, MASK, "token", 2.0)[0], rtol=1e-9)
    assert metrics["rollout_corr/kl"] == pytest.approx(mm(-LR))
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(mm(np.exp(LR) - LR - 1))
