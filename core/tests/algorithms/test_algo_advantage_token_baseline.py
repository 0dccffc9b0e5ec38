"""Optimal Token Baseline estimators against a hand-worked case and numpy loops of verl's formulas."""

import numpy as np
import pytest
import torch

from verl.algorithms import (
    AdvantageEstimator,
    compute_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
    get_adv_estimator_fn,
)

OTB = compute_optimal_token_baseline_advantage
TIR = compute_multi_turn_optimal_token_baseline_advantage


def t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def np_otb(r, m, index, old_lp, spi2, isw=None, zero_tail=True, eps=1e-8):
    """verl's compute_optimal_token_baseline_advantage, written as loops over groups and steps."""
    returns = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
    w = 1 - 2 * np.exp(old_lp) + spi2
    if isw is not None:
        w = w * isw**2
    wc = np.cumsum(w * m, -1)
    base = np.zeros_like(returns)
    for g in dict.fromkeys(index):
        rows = [i for i, x in enumerate(index) if x == g]
        if len(rows) == 1:
            continue
        for step in range(r.shape[1]):
            num = sum(returns[i, step] * wc[i, step] * m[i, step] for i in rows)
            den = sum(wc[i, step] * m[i, step] for i in rows) + eps
            for i in rows:
                base[i, step] = num / den
        if zero_tail:
            lens = m[rows].sum(-1)
            ordered = sorted(lens)
            longest = ordered[-1]
            top = [i for i, length in zip(rows, lens, strict=True) if length == longest]
            if len(top) == 1 and ordered[-1] > ordered[-2]:
                base[top[0], int(ordered[-2]) :] = 0.0
    return (returns - base) * m, returns


def np_tir(r, m, index, old_lp, spi2, isw=None, zero_tail=True, eps=1e-8):
    """verl's multi-turn OTB: compact each row's valid steps, run OTB on the compacted rows, scatter back."""
    returns = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1)
    w = 1 - 2 * np.exp(old_lp) + spi2
    if isw is not None:
        w = w * isw**2
    wc = np.cumsum(w * m, -1)
    lens = m.sum(-1).astype(int)
    width = lens.max()
    cr, cw, cm = np.zeros((len(r), width)), np.zeros((len(r), width)), np.zeros((len(r), width))
    for i in range(len(r)):
        sel = m[i] > 0
        cr[i, : lens[i]], cw[i, : lens[i]], cm[i, : lens[i]] = returns[i, sel], wc[i, sel], 1
    base = np.zeros_like(cr)
    for g in dict.fromkeys(index):
        rows = [i for i, x in enumerate(index) if x == g and lens[i] > 0]
        if len(rows) <= 1:
            continue
        b = (cr[rows] * cw[rows]).sum(0) / (cw[rows].sum(0) + eps)
        base[rows] = b
        if zero_tail:
            gl = lens[rows]
            ordered = sorted(gl)
            longest = ordered[-1]
            top = [i for i, length in zip(rows, gl, strict=True) if length == longest]
            if len(top) == 1 and ordered[-1] > ordered[-2]:
                base[top[0], ordered[-2] :] = 0.0
    adv = np.zeros_like(returns)
    for i in range(len(r)):
        adv[i, m[i] > 0] = (cr[i] - base[i])[: lens[i]]
    return adv, returns


def test_hand_worked_group_of_two():
    # π = 0.5 and Σπ² = 0.5 everywhere -> w = 0.5. Row 0 (3 tokens) scores 1, row 1 (2 tokens) scores 0.
    # G: [1,1,1] / [0,0,0]; W: [.5,1,1.5] / [.5,1,(1)]; B = [.5, .5, 1]; zero tail: row 0 has B_2 = 0.
    r = [[0, 0, 1], [0, 0, 0]]
    m = [[1, 1, 1], [1, 1, 0]]
    lp = np.log(np.full((2, 3), 0.5))
    adv, ret = OTB(t(r), t(m), ["p", "p"], t(lp), t(np.full((2, 3), 0.5)))
    np.testing.assert_allclose(adv.numpy(), [[0.5, 0.5, 1.0], [-0.5, -0.5, 0.0]], atol=1e-7)
    np.testing.assert_allclose(ret.numpy(), [[1, 1, 1], [0, 0, 0]])
    adv_no_tail, _ = OTB(t(r), t(m), ["p", "p"], t(lp), t(np.full((2, 3), 0.5)), handle_zero_tail=False)
    np.testing.assert_allclose(adv_no_tail.numpy()[0], [0.5, 0.5, 0.0], atol=1e-7)  # B_2 = G_2 of row 0 alone


def batch(seed, rows=9, width=6, interior_holes=False):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, width + 1, rows)
    m = (np.arange(width)[None, :] < lens[:, None]).astype(float)
    if interior_holes:  # tool/observation tokens inside a response
        m[:, 1] = np.where(lens > 2, 0.0, m[:, 1])
    r = rng.normal(size=(rows, width)) * (rng.random((rows, width)) < 0.4)
    probs = rng.uniform(0.05, 0.95, (rows, width))
    spi2 = np.minimum(1.0, probs**2 + rng.uniform(0, 0.3, (rows, width)))
    isw = rng.uniform(0.5, 1.5, (rows, width))
    index = ["a", "a", "a", "b", "b", "c", "d", "d", "d"][:rows]
    return r, m, index, np.log(probs), spi2, isw


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("with_is", [False, True])
def test_otb_matches_numpy_loop(seed, zero_tail, with_is):
    r, m, index, lp, spi2, isw = batch(seed)
    w = isw if with_is else None
    expected, returns = np_otb(r, m, index, lp, spi2, w, zero_tail)
    adv, ret = OTB(t(r), t(m), index, t(lp), t(spi2), None if w is None else t(w), handle_zero_tail=zero_tail)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), returns * m, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tir_matches_numpy_loop_with_interior_masked_tokens(seed):
    r, m, index, lp, spi2, isw = batch(seed, interior_holes=True)
    assert (m[:, 1] == 0).any() and (m[:, 2] == 1).any()
    expected, returns = np_tir(r, m, index, lp, spi2, isw)
    adv, ret = TIR(t(r), t(m), index, t(lp), t(spi2), t(isw))
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), returns * m, rtol=1e-12)
    plain, _ = OTB(t(r), t(m), index, t(lp), t(spi2), t(isw))
    assert not torch.allclose(adv, plain)  # steps are aligned differently once a response has holes


@pytest.mark.parametrize("seed", [0, 1])
def test_tir_equals_otb_without_interior_holes(seed):
    r, m, index, lp, spi2, _ = batch(seed)
    np.testing.assert_allclose(
        TIR(t(r), t(m), index, t(lp), t(spi2))[0].numpy(), OTB(t(r), t(m), index, t(lp), t(spi2))[0].numpy()
    )


def test_singletons_keep_their_returns_and_empty_rows_get_zero():
    r = [[0, 2.0], [0, 1.0], [5.0, 0]]
    m = [[1, 1], [0, 0], [1, 1]]  # row 1 is empty; rows 0 and 1 share a group, so row 0 is effectively alone
    lp, spi2 = np.log(np.full((3, 2), 0.3)), np.full((3, 2), 0.2)
    for fn in (OTB, TIR):
        adv, _ = fn(t(r), t(m), ["a", "a", "b"], t(lp), t(spi2))
        np.testing.assert_allclose(adv.numpy(), [[2.0, 2.0], [0, 0], [5.0, 0.0]], atol=1e-12)


def test_missing_or_misshaped_inputs_are_named():
    r, m = t([[1.0, 0.0]]), t([[1, 1]])
    with pytest.raises(ValueError, match="sum_pi_squared"):
        OTB(r, m, ["a"], t([[0.0, 0.0]]), None)
    with pytest.raises(ValueError, match="old_log_probs"):
        OTB(r, m, ["a"], t([[0.0]]), t([[0.0, 0.0]]))
    with pytest.raises(ValueError, match="index has 2 entries"):
        TIR(r, m, ["a", "b"], t([[0.0, 0.0]]), t([[0.0, 0.0]]))


def test_driver_passes_the_extra_tensors_and_names_what_is_missing():
    protocol = pytest.importorskip("verl.protocol")
    r, m, index, lp, spi2, isw = batch(0)
    tensors = {"token_level_rewards": t(r), "response_mask": t(m), "old_log_probs": t(lp)}
    uid = {"uid": np.array(index, dtype=object)}
    with pytest.raises(KeyError, match="sum_pi_squared"):
        compute_advantage(protocol.DataProto.from_dict(tensors=tensors, non_tensors=uid), "optimal_token_baseline")
    data = protocol.DataProto.from_dict(
        tensors={**tensors, "sum_pi_squared": t(spi2), "rollout_is_weights": t(isw)}, non_tensors=uid
    )
    out = compute_advantage(data, AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
    np.testing.assert_allclose(out.batch["advantages"].numpy(), np_otb(r, m, index, lp, spi2, isw)[0], atol=1e-10)


def test_registered_under_verl_names():
    assert get_adv_estimator_fn("optimal_token_baseline") is OTB
    assert get_adv_estimator_fn(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE) is TIR
