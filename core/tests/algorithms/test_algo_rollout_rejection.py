"""Rollout rejection sampling (verl's rollout_rs): every mode, its thresholds, the chained modes and the
masked-fraction metrics, against numpy and by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.algorithms.rollout_correction import compute_rollout_correction_and_rejection_mask
from verl.algorithms.rollout_rejection import (
    ROLLOUT_RS_OPTIONS,
    compute_rollout_rejection_mask,
    parse_rollout_rs,
    parse_rollout_rs_thresholds,
)

# Row 3 is empty; row 1 holds one token far off (log-ratio 1.5), row 4 one beyond the ±20 clamp (its padding).
LR = np.array(
    [
        [0.05, -0.1, 0.2, 0.0],
        [0.1, 1.5, -0.2, 0.0],
        [-0.6, -0.4, -0.5, 0.1],
        [3.0, 3.0, 3.0, 3.0],
        [0.3, 0.25, 0.0, 30.0],
    ]
)
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=np.float64)
VALID_ROWS = MASK.sum(-1) > 0
# A threshold per mode that keeps some rows / tokens and drops others on this batch.
THRESHOLDS = {
    "token_k1": "0.8_1.3",
    "token_k2": 0.02,
    "token_k3": 0.02,
    "seq_sum_k1": "0.5_1.5",
    "seq_sum_k2": 0.05,
    "seq_sum_k3": 0.05,
    "seq_mean_k1": "0.8_1.2",
    "seq_mean_k2": 0.02,
    "seq_mean_k3": 0.02,
    "seq_max_k2": 0.05,
    "seq_max_k3": 0.05,
}


def t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def mm(x, m=MASK):
    return float((x * m).sum() / m.sum())


def np_stat(mode, lr, m):
    x = np.clip(lr, -20, 20)
    token = {"k1": -x, "k2": 0.5 * x**2, "k3": np.exp(x) - 1 - x}[mode.rsplit("_", 1)[1]]
    count = m.sum(-1)
    if mode.startswith("token_"):
        return token
    if mode.startswith("seq_sum_"):
        return (token * m).sum(-1)
    if mode.startswith("seq_mean_"):
        return np.where(count > 0, (token * m).sum(-1) / np.maximum(count, 1), 0.0)
    return np.where(count > 0, np.where(m > 0, token, -np.inf).max(-1), 0.0)


def np_reject(mode, spec, lr=LR, m=MASK):
    """(keep mask (batch, len), metrics) restating verl's compute_rollout_rejection_mask / compute_rs_metrics."""
    k1 = mode.endswith("k1")
    if k1:
        lo, hi = (float(v) for v in spec.split("_")) if isinstance(spec, str) else (1 / spec, spec)
        lo, hi = math.log(lo), math.log(hi)
    else:
        lo, hi = None, float(spec)
    stat = np_stat(mode, lr, m)
    keep = (stat >= lo) & (stat <= hi) if k1 else stat <= hi
    if mode.startswith("token_"):
        stat_tok, seq, level = stat, np.where(m.sum(-1) > 0, (stat * m).sum(-1) / np.maximum(m.sum(-1), 1), 0), "tok"
    else:
        stat_tok, seq, level = np.repeat(stat[:, None], lr.shape[1], 1), stat, "seq"
        keep = np.repeat(keep[:, None], lr.shape[1], 1)
    p = f"rollout_rs_{mode}"
    valid, seqs = m > 0, seq[m.sum(-1) > 0]
    out = {f"{p}_mean": mm(stat_tok, m)}
    if level == "seq":
        out[f"{p}_max"], out[f"{p}_min"] = seqs.max(), seqs.min()
        out[f"{p}_fraction_high"] = (seqs > hi).mean()
        out[f"{p}_fraction_low"] = (seqs < lo).mean() if k1 else 0.0
    else:
        out[f"{p}_max"], out[f"{p}_min"] = stat_tok[valid].max(), stat_tok[valid].min()
        out[f"{p}_fraction_high"] = mm(stat_tok > hi, m)
        out[f"{p}_fraction_low"] = mm(stat_tok < lo, m) if k1 else 0.0
    c = np.clip(stat_tok, lo if k1 else 0.0, hi)
    out[f"{p}_std"] = math.sqrt(max(mm(c**2, m) - mm(c, m) ** 2, 0))
    out[f"{p}_seq_mean"], out[f"{p}_seq_std"] = seqs.mean(), seqs.std(ddof=1)
    out[f"{p}_seq_max"], out[f"{p}_seq_min"] = seqs.max(), seqs.min()
    out[f"{p}_seq_max_deviation"] = np.abs(seqs).max()
    out[f"{p}_seq_fraction_high"] = (seqs > hi).mean()
    if k1:
        out[f"{p}_seq_fraction_low"] = (seqs < lo).mean()
    out[f"{p}_masked_fraction"] = mm(1 - keep, m)
    out[f"{p}_seq_masked_fraction"] = (~keep & valid).any(-1)[m.sum(-1) > 0].mean()
    return keep, out


@pytest.mark.parametrize("mode", ROLLOUT_RS_OPTIONS)
def test_every_mode_matches_numpy(mode):
    spec = THRESHOLDS[mode]
    mask, metrics = compute_rollout_rejection_mask(t(LR), t(MASK), rollout_rs=mode, rollout_rs_threshold=spec)
    keep, expected = np_reject(mode, spec)
    np.testing.assert_array_equal(mask.numpy(), MASK * keep)
    expected["rollout_rs_masked_fraction"] = expected[f"rollout_rs_{mode}_masked_fraction"]
    expected["rollout_rs_seq_masked_fraction"] = ((keep == 0) & (MASK > 0)).any(-1).mean()  # over all 5 rows
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(float(value), rel=1e-9, abs=1e-12), key
    # The thresholds were chosen so that each mode keeps some valid tokens and drops others.
    kept = (mask.numpy() > 0).sum()
    assert 0 < kept < MASK.sum(), mode


def test_chained_modes_must_all_pass_and_are_deduplicated():
    spec = "0.8_1.3,0.05"
    mask, metrics = compute_rollout_rejection_mask(t(LR), t(MASK), "token_k1, seq_max_k2,token_k1", spec)
    keep_a, metrics_a = np_reject("token_k1", "0.8_1.3")
    keep_b, metrics_b = np_reject("seq_max_k2", 0.05)
    both = keep_a & keep_b
    np.testing.assert_array_equal(mask.numpy(), MASK * both)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(mm(1 - both))
    assert metrics["rollout_rs_seq_masked_fraction"] == pytest.approx((~both & (MASK > 0)).any(-1).mean())
    for key, value in {**metrics_a, **metrics_b}.items():
        assert metrics[key] == pytest.approx(float(value), rel=1e-9, abs=1e-12), key
    # Both modes reject something the other keeps, so the AND is stricter than either.
    assert (keep_a & ~keep_b & (MASK > 0)).any() and (keep_b & ~keep_a & (MASK > 0)).any()


def test_token_k1_band_by_hand():
    # ratios 1.0, 0.45, 2.5, 1.9 (log-ratios); band "0.5_2.0" keeps -log r in [log 0.5, log 2]: r in [0.5, 2].
    lr = np.log([[1.0, 0.45, 2.5, 1.9]])
    mask, metrics = compute_rollout_rejection_mask(t(lr), t([[1, 1, 1, 1]]), "token_k1", "0.5_2.0")
    np.testing.assert_array_equal(mask.numpy(), [[1, 0, 0, 1]])
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(0.5)
    assert metrics["rollout_rs_seq_masked_fraction"] == 1.0
    # a single number u means the band [1/u, u]
    single, _ = compute_rollout_rejection_mask(t(lr), t([[1, 1, 1, 1]]), "token_k1", 2.0)
    np.testing.assert_array_equal(single.numpy(), mask.numpy())


def test_k1_bounds_apply_to_minus_log_ratio_as_in_verl():
    # "0.9_1.5" keeps log 0.9 <= -log r <= log 1.5, i.e. r in [1/1.5, 1/0.9] = [0.667, 1.111].
    lr = np.log([[0.7, 1.05, 1.2, 1.4]])
    mask, _ = compute_rollout_rejection_mask(t(lr), t([[1, 1, 1, 1]]), "token_k1", "0.9_1.5")
    np.testing.assert_array_equal(mask.numpy(), [[1, 1, 0, 0]])


def test_sequence_mode_drops_whole_rows_by_hand():
    # seq_mean_k3 per row: mean of e^x - 1 - x; row 0 (x = 0.1, 0.1): 0.00517 <= 0.01 kept; row 1 (x = 0.5): 0.1487 dropped.
    lr = np.array([[0.1, 0.1, 0.0], [0.5, 0.0, 0.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    out, metrics = compute_rollout_rejection_mask(t(lr), t(mask), "seq_mean_k3", 0.01)
    np.testing.assert_array_equal(out.numpy(), [[1, 1, 0], [0, 0, 0]])
    assert metrics["rollout_rs_seq_mean_k3_seq_max"] == pytest.approx(math.exp(0.5) - 1.5)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    assert metrics["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    assert out.dtype == torch.float64  # the response mask's dtype is kept


def test_mask_keeps_an_integer_dtype():
    mask, _ = compute_rollout_rejection_mask(t([[0.0, 2.0]]), torch.tensor([[1, 1]]), "token_k2", 1.0)
    assert mask.dtype == torch.int64 and mask.tolist() == [[1, 0]]


@pytest.mark.parametrize(
    ("modes", "spec", "expected"),
    [
        (["token_k1"], 2.0, {"token_k1": (0.5, 2.0)}),
        (["token_k1"], "0.9_1.1", {"token_k1": (0.9, 1.1)}),
        (["seq_sum_k2", "token_k1"], "3", {"seq_sum_k2": (None, 3.0), "token_k1": (1 / 3, 3.0)}),
        (["seq_max_k3", "seq_mean_k1"], "0.1, 0.5_2", {"seq_max_k3": (None, 0.1), "seq_mean_k1": (0.5, 2.0)}),
    ],
)
def test_threshold_parsing(modes, spec, expected):
    got = parse_rollout_rs_thresholds(modes, spec)
    assert list(got) == list(expected)
    for mode, (lower, upper) in expected.items():
        assert got[mode][1] == pytest.approx(upper)
        assert got[mode][0] == (None if lower is None else pytest.approx(lower))


@pytest.mark.parametrize(
    ("modes", "spec", "error", "match"),
    [
        (["token_k2"], "0.5_2", ValueError, "single upper bound"),
        (["token_k1", "token_k2"], "1,2,3", ValueError, "3 entries for 2"),
        (["token_k1"], "2_1", ValueError, "lower bound exceeds"),
        (["token_k3"], -1.0, ValueError, "> 0"),
        (["token_k1"], "abc", ValueError, "not a number"),
        (["token_k1"], None, ValueError, "needs rollout_rs_threshold"),
        (["token_k1"], True, TypeError, "number or a string"),
    ],
)
def test_bad_thresholds_are_refused(modes, spec, error, match):
    with pytest.raises(error, match=match):
        parse_rollout_rs_thresholds(modes, spec)


def test_mode_parsing():
    assert parse_rollout_rs(" seq_sum_k1,token_k3 ,seq_sum_k1") == ["seq_sum_k1", "token_k3"]
    with pytest.raises(ValueError, match="'seq_max_k1' is unknown"):
        parse_rollout_rs("seq_max_k1")  # verl has no max of the signed k1
    with pytest.raises(ValueError, match="names no mode"):
        parse_rollout_rs(" , ")


def test_combined_function_masks_but_keeps_the_weights():
    # rollout_is weights are computed on the unmasked rows: rejection acts through the mask only (verl).
    old, roll = t(LR), t(np.zeros_like(LR))
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old,
        roll,
        t(MASK),
        rollout_is="token",
        rollout_is_threshold=5.0,
        rollout_rs="token_k2",
        rollout_rs_threshold=0.02,
    )
    keep, _ = np_reject("token_k2", 0.02)
    np.testing.assert_array_equal(mask.numpy(), MASK * keep)
    np.testing.assert_allclose(weights.numpy(), np.minimum(np.exp(np.clip(LR, -20, 20)), 5.0) * MASK, rtol=1e-12)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(mm(1 - keep))
    assert metrics["rollout_corr/kl"] == pytest.approx(mm(-LR))  # diagnostics on the unmasked tokens
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        compute_rollout_correction_and_rejection_mask(old, roll, t(MASK), rollout_rs="token_k1")


def test_no_valid_token_rejects_nothing():
    mask, metrics = compute_rollout_rejection_mask(t([[1.0, 2.0]]), t([[0, 0]]), "token_k1", 2.0)
    assert mask.tolist() == [[0.0, 0.0]] and metrics == {}
