"""Policy losses against numpy references, gradients (stop-grad semantics), IS weights, extreme ratios."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.algorithms import (
    compute_global_batch_info,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)

RNG = np.random.default_rng(3)
OLD = -np.abs(RNG.normal(size=(4, 6))) - 0.1
NEW = OLD + RNG.normal(scale=0.4, size=(4, 6))
ADV = RNG.normal(size=(4, 6))
MASK = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=float)
CFG = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, dro_beta=0.1)
KEYS = {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


def t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


def tok_mean(x, m):
    return (x * m).sum() / m.sum()


def seq_mean_tok_mean(x, m):
    return np.mean([(x[i] * m[i]).sum() / m[i].sum() for i in range(len(m)) if m[i].sum() > 0])


def run(fn, *, old=OLD, new=NEW, adv=ADV, mask=MASK, mode="token-mean", cfg=CFG, w=None, **kw):
    return fn(t(old), t(new), t(adv), t(mask), mode, cfg, None if w is None else t(w), **kw)


# ---------------------------------------------------------------------------------------------- vanilla
def np_vanilla(old, new, a, m, lo, hi, c):
    lr = np.clip(new - old, -20, 20)
    r = np.exp(lr)
    l1, l2 = -a * r, -a * np.clip(r, 1 - lo, 1 + hi)
    clipped = np.maximum(l1, l2)
    l3 = -a * c
    loss = np.where(a < 0, np.minimum(l3, clipped), clipped)
    return (
        tok_mean(loss, m),
        tok_mean(l2 > l1, m),
        tok_mean(-lr, m),
        tok_mean((clipped > l3) & (a < 0), m),
    )


def test_vanilla_matches_numpy_with_asymmetric_and_dual_clip():
    new = NEW.copy()
    new[1, 0] = OLD[1, 0] + 2.0  # ratio 7.39 > clip_ratio_c
    adv = ADV.copy()
    adv[1, 0] = -1.0  # A < 0: dual clip active
    loss, metrics = run(compute_policy_loss_vanilla, new=new, adv=adv)
    exp_loss, exp_cf, exp_kl, exp_lower = np_vanilla(OLD, new, adv, MASK, 0.2, 0.28, 3.0)
    assert loss.item() == pytest.approx(exp_loss, rel=1e-10)
    assert set(metrics) == KEYS
    assert metrics["actor/pg_clipfrac"] == pytest.approx(exp_cf)
    assert metrics["actor/ppo_kl"] == pytest.approx(exp_kl)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(exp_lower)
    assert exp_lower > 0


def test_vanilla_by_hand():
    # A=-1, r=e^2: L1=7.389, L2=1.2 -> max 7.389 -> dual clip min(3, 7.389) = 3
    loss, m = compute_policy_loss_vanilla(t([[0.0]]), t([[2.0]]), t([[-1.0]]), t([[1]]), config=CFG)
    assert loss.item() == pytest.approx(3.0)
    assert m["actor/pg_clipfrac_lower"] == 1.0
    # A=+1, r=e^1: clipped at 1 + 0.28 -> loss -1.28 (asymmetric high clip)
    loss, m = compute_policy_loss_vanilla(t([[0.0]]), t([[1.0]]), t([[1.0]]), t([[1]]), config=CFG)
    assert loss.item() == pytest.approx(-1.28)
    assert m["actor/pg_clipfrac"] == 1.0
    # A=-1, r=e^-1: clipped at 1 - 0.2 -> loss 0.8
    loss, _ = compute_policy_loss_vanilla(t([[0.0]]), t([[-1.0]]), t([[-1.0]]), t([[1]]), config=CFG)
    assert loss.item() == pytest.approx(0.8)


def test_vanilla_defaults_and_config_kinds():
    expected = np_vanilla(OLD, NEW, ADV, MASK, 0.2, 0.2, 3.0)[0]
    for cfg in (None, {"clip_ratio": 0.2}, SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None)):
        assert run(compute_policy_loss_vanilla, cfg=cfg)[0].item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        run(compute_policy_loss_vanilla, cfg=SimpleNamespace(clip_ratio_c=1.0))


def test_vanilla_global_batch_info_makes_microbatches_sum_to_full():
    info = compute_global_batch_info(t(MASK))
    full = run(compute_policy_loss_vanilla)[0].item()
    parts = sum(
        compute_policy_loss_vanilla(t(OLD[s]), t(NEW[s]), t(ADV[s]), t(MASK[s]), config=CFG, global_batch_info=info)[
            0
        ].item()
        for s in (slice(0, 1), slice(1, 4))
    )
    assert parts == pytest.approx(full, rel=1e-12)
    cfg = SimpleNamespace(**vars(CFG), global_batch_info=info)
    row0 = compute_policy_loss_vanilla(t(OLD[:1]), t(NEW[:1]), t(ADV[:1]), t(MASK[:1]), config=cfg)[0].item()
    assert row0 == pytest.approx((np_vanilla_tokens(0) * MASK[:1]).sum() / MASK.sum())


def np_vanilla_tokens(row):
    lr = NEW[row : row + 1] - OLD[row : row + 1]
    r, a = np.exp(lr), ADV[row : row + 1]
    clipped = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28))
    return np.where(a < 0, np.minimum(-a * 3.0, clipped), clipped)


# ---------------------------------------------------------------------------------------------- others
def test_gspo_matches_numpy_and_ignores_agg_mode():
    seq = np.exp([((NEW[i] - OLD[i]) * MASK[i]).sum() / MASK[i].sum() for i in range(4)])[:, None]
    l1, l2 = -ADV * seq, -ADV * np.clip(seq, 0.8, 1.28)
    expected = seq_mean_tok_mean(np.maximum(l1, l2), MASK)
    for mode in ("token-mean", "seq-mean-token-mean"):
        loss, metrics = run(compute_policy_loss_gspo, mode=mode)
        assert loss.item() == pytest.approx(expected, rel=1e-10)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(tok_mean(l2 > l1, MASK))


def test_gspo_gradient_is_sequence_ratio_times_token_score():
    old, new, adv = np.array([[-1.0, -2.0, -0.5]]), np.array([[-0.95, -2.05, -0.5]]), np.array([[1.0, 1.0, 1.0]])
    lp = t(new, grad=True)
    loss, _ = compute_policy_loss_gspo(t(old), lp, t(adv), t([[1, 1, 1]]), config=CFG)
    loss.backward()
    s = np.exp((new - old).mean())  # = 1 here, inside the clip range
    np.testing.assert_allclose(lp.grad.numpy(), -adv * s / 3)


def test_sapo_matches_numpy():
    r = np.exp(NEW - OLD)
    tau = np.where(ADV > 0, 1.0, 1.05)
    gates = 1 / (1 + np.exp(-tau * (r - 1))) * 4 / tau
    loss, metrics = run(compute_policy_loss_sapo)
    assert loss.item() == pytest.approx(seq_mean_tok_mean(-gates * ADV, MASK), rel=1e-10)
    assert metrics["actor/pg_clipfrac"] == 0.0
    cfg = SimpleNamespace(tau_pos=2.0, tau_neg=3.0)
    tau = np.where(ADV > 0, 2.0, 3.0)
    gates = 1 / (1 + np.exp(-tau * (r - 1))) * 4 / tau
    assert run(compute_policy_loss_sapo, cfg=cfg)[0].item() == pytest.approx(seq_mean_tok_mean(-gates * ADV, MASK))


def test_gpg_matches_numpy():
    loss, metrics = run(compute_policy_loss_gpg)
    assert loss.item() == pytest.approx(tok_mean(-NEW * ADV, MASK), rel=1e-10)
    assert set(metrics) == KEYS


def test_clip_cov_detaches_selected_tokens():
    cfg = SimpleNamespace(
        **vars(CFG), policy_loss=SimpleNamespace(clip_cov_ratio=1.0, clip_cov_lb=0.0, clip_cov_ub=5.0)
    )
    r = np.exp(NEW - OLD)
    l1, l2 = -ADV * r, -ADV * np.clip(r, 0.8, 1.28)
    mean_a = tok_mean(ADV, MASK)
    mean_lp = tok_mean(NEW, MASK)
    cov = (ADV - mean_a) * (NEW - mean_lp)
    chosen = (MASK > 0) & ~(l2 > l1) & (cov > 0.0) & (cov < 5.0)
    assert 0 < chosen.sum() < MASK.sum()
    lp = t(NEW, grad=True)
    loss, metrics = compute_policy_loss_clip_cov(t(OLD), lp, t(ADV), t(MASK), config=cfg)
    assert loss.item() == pytest.approx(tok_mean(np.maximum(l1, l2) * ~chosen, MASK), rel=1e-10)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(chosen.sum() / MASK.sum())
    loss.backward()
    assert (lp.grad.numpy()[chosen] == 0).all()


def test_clip_cov_cuts_at_most_ratio_of_tokens():
    torch.manual_seed(0)
    cfg = SimpleNamespace(policy_loss=SimpleNamespace(clip_cov_ratio=0.1, clip_cov_lb=-1e9, clip_cov_ub=1e9))
    _, metrics = run(compute_policy_loss_clip_cov, cfg=cfg)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(max(int(0.1 * MASK.sum()), 1) / MASK.sum())


def test_kl_cov_penalises_top_covariance_token():
    cfg = SimpleNamespace(policy_loss=SimpleNamespace(kl_cov_ratio=1e-4, ppo_kl_coef=0.5))
    valid = MASK > 0
    a, lp = ADV[valid], NEW[valid]
    cov = (a - a.mean()) * (lp - lp.mean())
    top = np.zeros_like(MASK, dtype=bool)
    top[tuple(np.argwhere(valid)[np.argmax(cov)])] = True
    lr = NEW - OLD
    expected = tok_mean(-ADV * np.exp(lr) + top * 0.5 * np.abs(lr), MASK)
    loss, metrics = run(compute_policy_loss_kl_cov, cfg=cfg)
    assert loss.item() == pytest.approx(expected, rel=1e-10)
    assert metrics["actor/ppo_kl"] == pytest.approx(tok_mean(np.abs(lr), MASK))


def np_geo_mean(old, new, adv, m, lo, hi):
    losses = []
    for i in range(len(m)):
        v = m[i] > 0
        if not v.any():
            continue
        d = new[i][v] - old[i][v]
        dc = np.clip(d, -lo, hi)
        sg = np.sign(adv[i][v])
        dm = sg * np.minimum(sg * d, sg * dc)
        losses.append(-adv[i][v].mean() * np.exp(dm.mean()))
    return np.mean(losses)


def test_geo_mean_matches_numpy_and_skips_empty_rows():
    loss, metrics = run(compute_policy_loss_geo_mean)
    assert loss.item() == pytest.approx(np_geo_mean(OLD, NEW, ADV, MASK, 0.2, 0.28), rel=1e-10)
    d = NEW - OLD
    clipped = d != np.clip(d, -0.2, 0.28)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(tok_mean(clipped & (ADV > 0), MASK))
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(tok_mean(clipped & (ADV < 0), MASK))
    mask = MASK.copy()
    mask[2] = 0
    assert run(compute_policy_loss_geo_mean, mask=mask)[0].item() == pytest.approx(
        np_geo_mean(OLD, NEW, ADV, mask, 0.2, 0.28), rel=1e-10
    )


def test_cispo_value_and_stop_gradient():
    r = np.exp(NEW - OLD)
    w = np.clip(r, 0.8, 1.28)
    lp = t(NEW, grad=True)
    loss, metrics = compute_policy_loss_cispo(t(OLD), lp, t(ADV), t(MASK), config=CFG)
    assert loss.item() == pytest.approx(tok_mean(-w * ADV * NEW, MASK), rel=1e-10)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(tok_mean(r != w, MASK))
    loss.backward()
    np.testing.assert_allclose(lp.grad.numpy(), -w * ADV * MASK / MASK.sum(), rtol=1e-10)


def test_dro_value_gradient_and_beta_validation():
    cfg = SimpleNamespace(policy_loss=SimpleNamespace(dro_beta=0.3))
    lp = t(NEW, grad=True)
    loss, _ = compute_policy_loss_dro(t(OLD), lp, t(ADV), t(MASK), config=cfg)
    per_tok = -(ADV * NEW - 0.5 * 0.3 * (NEW - OLD) ** 2)
    assert loss.item() == pytest.approx(tok_mean(per_tok, MASK), rel=1e-10)
    loss.backward()
    np.testing.assert_allclose(lp.grad.numpy(), (-ADV + 0.3 * (NEW - OLD)) * MASK / MASK.sum(), rtol=1e-10)
    assert run(compute_policy_loss_dro, cfg={"dro_beta": 0.3})[0].item() == pytest.approx(loss.item())
    with pytest.raises(ValueError, match="dro_beta"):
        run(compute_policy_loss_dro, cfg={"dro_beta": 0.0})


# ---------------------------------------------------------------------------------------------- common
ALL = ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "dro"]


@pytest.mark.parametrize("name", ALL)
def test_registered_under_verl_name_with_all_metric_keys(name):
    fn = get_policy_loss_fn(name)
    torch.manual_seed(0)
    loss, metrics = run(fn)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert set(metrics) == KEYS and all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("name", ALL)
def test_rollout_is_weights_multiply_the_per_token_loss(name):
    fn = get_policy_loss_fn(name)
    torch.manual_seed(0)
    base = run(fn)[0].item()
    torch.manual_seed(0)
    assert run(fn, w=np.full_like(MASK, 0.5))[0].item() == pytest.approx(0.5 * base, rel=1e-9)
    w = np.ones_like(MASK)
    w[1] = 0.0  # zero weight removes row 1 from the numerator
    torch.manual_seed(0)
    weighted = run(fn, w=w)[0].item()
    if name not in ("kl_cov", "clip_cov"):  # their token selection depends on the whole batch
        rows = [0, 2, 3]
        torch.manual_seed(0)
        only = fn(t(OLD[rows]), t(NEW[rows]), t(ADV[rows]), t(MASK[rows]), "token-mean", CFG)[0].item()
        seq_mode = name in ("gspo", "sapo", "geo_mean")
        n_keep, n_all = (3, 4) if seq_mode else (MASK[rows].sum(), MASK.sum())
        assert weighted == pytest.approx(only * n_keep / n_all, rel=1e-9)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("delta", [1000.0, -1000.0])
def test_extreme_log_ratios_give_finite_loss_and_gradient(name, delta):
    fn = get_policy_loss_fn(name)
    new = OLD.copy()
    new[:, :2] += delta
    lp = torch.tensor(new, dtype=torch.float32, requires_grad=True)
    torch.manual_seed(0)
    loss, metrics = fn(
        torch.tensor(OLD, dtype=torch.float32), lp, torch.tensor(ADV, dtype=torch.float32), t(MASK), config=CFG
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(lp.grad).all()
    assert all(np.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("name", ALL)
def test_shape_mismatch_is_a_value_error(name):
    with pytest.raises(ValueError, match="shape"):
        get_policy_loss_fn(name)(t(OLD), t(NEW), t(ADV[:, :3]), t(MASK), config=CFG)
