"""masked reductions, whitening, entropy and log-probs against numpy references (K05)."""

import numpy as np
import pytest
import torch

from verl.algorithms import (
    agg_loss,
    compute_entropy_loss,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

RNG = np.random.default_rng(0)
VALUES = RNG.normal(size=(3, 5))
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=np.float64)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_masked_sum_and_mean_match_numpy():
    v, m = t(VALUES), t(MASK)
    sel = VALUES[MASK.astype(bool)]
    assert masked_sum(v, m).item() == pytest.approx(sel.sum())
    assert masked_mean(v, m).item() == pytest.approx(sel.mean())
    row_means = [VALUES[i][MASK[i].astype(bool)].mean() for i in range(3)]
    np.testing.assert_allclose(masked_mean(v, m, axis=-1).numpy(), row_means)
    np.testing.assert_allclose(masked_sum(v, m, axis=-1).numpy(), (VALUES * MASK).sum(-1))


def test_masked_reductions_ignore_nan_and_inf_in_padding():
    v = VALUES.copy()
    v[0, 3], v[0, 4], v[2, 1] = np.nan, np.inf, -np.inf
    tv = t(v).requires_grad_(True)
    mean = masked_mean(tv, t(MASK))
    assert mean.item() == pytest.approx(VALUES[MASK.astype(bool)].mean())
    mean.backward()
    grad = tv.grad.numpy()
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(grad, MASK / MASK.sum())


def test_masked_mean_of_empty_mask_is_zero_with_zero_grad():
    v = t(VALUES).requires_grad_(True)
    out = masked_mean(v, torch.zeros(3, 5))
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(v.grad, torch.zeros_like(v))
    row = masked_mean(t(VALUES), t(np.array([[1, 0, 0, 0, 0], [0] * 5, [0] * 5], dtype=float)), axis=-1)
    np.testing.assert_allclose(row.numpy(), [VALUES[0, 0], 0.0, 0.0])


def test_masked_var_unbiased_and_biased():
    sel = VALUES[MASK.astype(bool)]
    assert masked_var(t(VALUES), t(MASK)).item() == pytest.approx(sel.var(ddof=1))
    assert masked_var(t(VALUES), t(MASK), unbiased=False).item() == pytest.approx(sel.var(ddof=0))


def test_masked_var_of_one_or_zero_elements_is_zero_not_nan():
    one = np.zeros_like(MASK)
    one[1, 2] = 1
    assert masked_var(t(VALUES), t(one)).item() == 0.0
    assert masked_var(t(VALUES), torch.zeros(3, 5)).item() == 0.0


def test_masked_whiten_matches_verl_formula():
    sel = VALUES[MASK.astype(bool)]
    expected = (VALUES - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(masked_whiten(t(VALUES), t(MASK)).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(
        masked_whiten(t(VALUES), t(MASK), shift_mean=False).numpy(), expected + sel.mean(), rtol=1e-12
    )


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        masked_sum(torch.zeros(2, 3), torch.zeros(2, 4))


def np_entropy(z):
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    return -(p * np.log(p)).sum(-1)


def test_entropy_from_logits_matches_numpy():
    z = RNG.normal(size=(2, 3, 7)) * 3
    np.testing.assert_allclose(entropy_from_logits(t(z)).numpy(), np_entropy(z), rtol=1e-10)
    uniform = entropy_from_logits(torch.zeros(4, 10, dtype=torch.float64))
    np.testing.assert_allclose(uniform.numpy(), np.log(10))


def test_entropy_with_minus_inf_logits_is_finite_with_finite_grad():
    z = torch.tensor([[0.0, 1.0, -torch.inf, -torch.inf]], requires_grad=True)
    h = entropy_from_logits(z)
    assert h.item() == pytest.approx(np_entropy(np.array([[0.0, 1.0]]))[0], rel=1e-6)
    h.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_entropy_half_precision_computed_in_float32():
    z = torch.randn(2, 5, dtype=torch.bfloat16)
    assert entropy_from_logits(z).dtype == torch.float32


def test_logprobs_from_logits_matches_numpy():
    z = RNG.normal(size=(2, 3, 6))
    labels = RNG.integers(0, 6, size=(2, 3))
    zs = z - z.max(-1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(-1, keepdims=True))
    expected = np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(logprobs_from_logits(t(z), torch.tensor(labels)).numpy(), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(t(z), torch.tensor(labels[:, :2]))


# K05: entropy ignores padded slots --------------------------------------------------------------------
def test_k05_entropy_from_logprobs_ignores_pad_placeholders():
    logp = torch.tensor([[-0.5, -0.5, 1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0, 0]])
    assert masked_sum(-logp, mask).item() == pytest.approx(1.0)
    assert masked_mean(-logp, mask).item() == pytest.approx(0.5)
    assert agg_loss(-logp, mask, "token-mean").item() == pytest.approx(0.5)
    for pad in (-1e9, 0.0, 7.0, float("nan")):
        changed = logp.clone()
        changed[0, 2:] = pad
        assert masked_sum(-changed, mask).item() == pytest.approx(1.0)
        assert agg_loss(-changed, mask, "token-mean").item() == pytest.approx(0.5)


def test_k05_entropy_loss_uses_valid_positions_only():
    logits = torch.tensor(RNG.normal(size=(1, 5, 4)))
    mask = torch.tensor([[1, 1, 0, 0, 0]])
    expected = np_entropy(logits.numpy()[0, :2]).mean()
    garbage = logits.clone()
    garbage[0, 2:] = torch.tensor([1e4, -1e4, 0.0, 3.0], dtype=torch.float64)
    for z in (logits, garbage):
        ent = compute_entropy_loss(z, mask)
        assert ent.item() == pytest.approx(expected)
        assert ent.item() >= 0
