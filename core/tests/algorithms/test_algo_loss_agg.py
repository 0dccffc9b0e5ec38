"""agg_loss modes against numpy, global normalisation (K04), empty rows (K08), hypothesis split property."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.algorithms import LOSS_AGG_MODES, agg_loss, compute_global_batch_info

LOSS = np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0], [2.0, 0.0, 1.0, 3.0]])
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=np.float64)


def np_agg(loss, mask, mode, scale=None):
    """Hand reference: empty rows excluded from sequence counts."""
    lens = mask.sum(-1)
    row_sums = (loss * mask).sum(-1)
    nonempty = lens > 0
    if mode == "token-mean":
        return row_sums.sum() / lens.sum()
    if mode == "token-sum":
        return row_sums.sum()
    if mode == "seq-mean-token-sum":
        return row_sums[nonempty].mean()
    if mode == "seq-mean-token-mean":
        return (row_sums[nonempty] / lens[nonempty]).mean()
    if mode == "seq-mean-token-sum-norm":
        return row_sums[nonempty].mean() / (scale or loss.shape[-1])
    raise AssertionError(mode)


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_each_mode_matches_numpy(mode):
    got = agg_loss(t(LOSS), t(MASK), mode).item()
    assert got == pytest.approx(np_agg(LOSS, MASK, mode), rel=1e-8)


def test_by_hand_values():
    # rows: sums 6, -0.5, (empty), 6 ; lens 3, 2, 0, 4 ; 9 tokens, 3 non-empty rows
    assert agg_loss(t(LOSS), t(MASK), "token-mean").item() == pytest.approx(11.5 / 9)
    assert agg_loss(t(LOSS), t(MASK), "token-sum").item() == pytest.approx(11.5)
    assert agg_loss(t(LOSS), t(MASK), "seq-mean-token-sum").item() == pytest.approx(11.5 / 3)
    assert agg_loss(t(LOSS), t(MASK), "seq-mean-token-mean").item() == pytest.approx((2 - 0.25 + 1.5) / 3)
    assert agg_loss(t(LOSS), t(MASK), "seq-mean-token-sum-norm").item() == pytest.approx(11.5 / 3 / 4)
    assert agg_loss(t(LOSS), t(MASK), "seq-mean-token-sum-norm", loss_scale_factor=2).item() == pytest.approx(
        11.5 / 3 / 2
    )


def test_dp_size_and_global_normalisers():
    got = agg_loss(t(LOSS), t(MASK), "token-mean", dp_size=2, batch_num_tokens=18)
    assert got.item() == pytest.approx(11.5 / 18 * 2)
    got = agg_loss(t(LOSS), t(MASK), "seq-mean-token-mean", dp_size=4, global_batch_size=12)
    assert got.item() == pytest.approx((2 - 0.25 + 1.5) / 12 * 4)
    assert agg_loss(t(LOSS), t(MASK), "token-sum", dp_size=3).item() == pytest.approx(11.5 * 3)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_missing_global_normaliser_with_dp_is_an_error(mode):
    with pytest.raises(ValueError, match="required when dp_size > 1"):
        agg_loss(t(LOSS), t(MASK), mode, dp_size=2)


def test_unknown_mode_lists_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(t(LOSS), t(MASK), "token-avg")


def test_bad_arguments():
    with pytest.raises(ValueError, match="shape"):
        agg_loss(t(LOSS), t(MASK[:, :2]), "token-mean")
    with pytest.raises(ValueError, match="loss_scale_factor"):
        agg_loss(t(LOSS), t(MASK), "seq-mean-token-sum-norm", loss_scale_factor=0)
    with pytest.raises(ValueError, match="dp_size"):
        agg_loss(t(LOSS), t(MASK), "token-mean", dp_size=0)
    with pytest.raises(ValueError, match=">= 0"):
        agg_loss(t(LOSS), t(MASK), "token-mean", batch_num_tokens=-1)


def test_compute_global_batch_info_counts_tokens_and_nonempty_rows():
    assert compute_global_batch_info(t(MASK), dp_size=2) == {
        "dp_size": 2,
        "batch_num_tokens": 9,
        "global_batch_size": 3,
    }


# K04: token-mean must survive gradient accumulation -----------------------------------------------------
def test_k04_microbatch_sum_equals_minibatch_loss_and_gradient():
    loss = t([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]], grad=True)
    mask = t([[1, 0, 0], [1, 1, 1]])
    info = compute_global_batch_info(mask)
    assert info["batch_num_tokens"] == 4
    micro = agg_loss(loss[:1], mask[:1], "token-mean", **info) + agg_loss(loss[1:], mask[1:], "token-mean", **info)
    assert micro.item() == pytest.approx(1.25)
    micro.backward()
    grad_micro = loss.grad.clone()
    loss.grad = None
    full = agg_loss(loss, mask, "token-mean")
    assert full.item() == pytest.approx(1.25)
    full.backward()
    assert torch.allclose(grad_micro, loss.grad)
    np.testing.assert_allclose(grad_micro.numpy(), mask.numpy() / 4)
    wrong = 0.5 * agg_loss(loss[:1], mask[:1], "token-mean") + 0.5 * agg_loss(loss[1:], mask[1:], "token-mean")
    assert wrong.item() == pytest.approx(1.5)  # the known-wrong local-mean scaling


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 5), st.lists(st.floats(-10, 10), min_size=5, max_size=5)), min_size=1, max_size=8
    ),
    cuts=st.lists(st.integers(0, 8), max_size=4),
    mode=st.sampled_from(LOSS_AGG_MODES),
)
def test_any_microbatch_split_sums_to_full_batch(rows, cuts, mode):
    lens = np.array([n for n, _ in rows])
    loss = np.array([vals for _, vals in rows])
    mask = (np.arange(5)[None, :] < lens[:, None]).astype(np.float64)
    full_info = compute_global_batch_info(t(mask))
    full = agg_loss(t(loss), t(mask), mode, **full_info).item()
    assert full == pytest.approx(np_agg(loss, mask, mode) if mask.any() else 0.0, rel=1e-9, abs=1e-12)
    bounds = sorted({0, len(rows), *[c for c in cuts if c < len(rows)]})
    total = sum(
        agg_loss(t(loss[a:b]), t(mask[a:b]), mode, **full_info).item() for a, b in zip(bounds, bounds[1:], strict=False)
    )
    assert total == pytest.approx(full, rel=1e-9, abs=1e-12)


# K08: a zero-length response must not produce NaN ---------------------------------------------------------
def test_k08_empty_row_is_left_out_of_seq_mean_token_mean():
    loss = t([[0.5, 0.5], [0.7, 0.7]], grad=True)
    mask = t([[1, 1], [0, 0]])
    out = agg_loss(loss, mask, "seq-mean-token-mean")
    assert out.item() == pytest.approx(0.5)  # pinned choice: empty row excluded (not 0.25)
    out.backward()
    np.testing.assert_allclose(loss.grad.numpy(), [[0.5, 0.5], [0.0, 0.0]], rtol=1e-7)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_k08_all_zero_mask_gives_zero_loss_and_zero_grad(mode):
    loss = t([[0.5, np.nan], [np.inf, 0.7]], grad=True)
    out = agg_loss(loss, torch.zeros(2, 2), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 2, dtype=torch.float64))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_k08_empty_microbatch_with_global_normalisers_is_zero(mode):
    out = agg_loss(t([[1.0, 2.0]]), torch.zeros(1, 2), mode, dp_size=2, batch_num_tokens=6, global_batch_size=3)
    assert out.item() == 0.0
