"""dppo_tv, dppo_kl and bypass_mode against numpy ports of verl's formulas, and through the actor loss."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.algorithms import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)
from verl.algorithms.rollout_correction import (
    compute_rollout_correction_weights,
    parse_rollout_is_threshold,
)

RNG = np.random.default_rng(3)
OLD = np.log(RNG.uniform(0.05, 0.95, (4, 5)))
NEW = OLD + RNG.normal(0, 0.6, (4, 5))
NEW = np.minimum(NEW, -1e-3)  # keep π < 1 so the binary KL is finite
ADV = RNG.normal(size=(4, 5))
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=np.float64)
CFG = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.1, clip_ratio_high=0.15, clip_ratio_c=3.0)


def t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


def masked_mean(x, m):
    return (x * m).sum() / m.sum()


def np_dppo(old, new, a, m, lo, hi, c, kind):
    ratio = np.exp(np.clip(new - old, -20, 20))
    p, p_old = np.exp(new), np.exp(old)
    if kind == "tv":
        valid = np.where(a > 0, p - p_old <= hi, p - p_old >= -lo)
    else:
        kl = p_old * (old - new) + (1 - p_old) * np.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        valid = np.where(a > 0, (kl <= hi) | (p <= p_old), (kl <= lo) | (p >= p_old))
    valid = valid.astype(float)
    trunc = np.minimum(ratio, c)
    loss = masked_mean(-a * trunc * new * valid, m)
    grad = -a * trunc * valid * m / m.sum()  # d loss / d logπ (ratio and mask are constants)
    metrics = {
        "actor/pg_clipfrac": masked_mean(1 - valid, m),
        "actor/pg_clipfrac_lower": masked_mean((ratio > c) * valid, m),
        "actor/ppo_kl": masked_mean(old - new, m),
    }
    return loss, grad, metrics


@pytest.mark.parametrize(("fn", "kind"), [(compute_policy_loss_dppo_tv, "tv"), (compute_policy_loss_dppo_kl, "kl")])
@pytest.mark.parametrize("clip_c", [3.0, 1.2])
def test_dppo_loss_gradient_and_metrics_match_numpy(fn, kind, clip_c):
    cfg = SimpleNamespace(**{**vars(CFG), "clip_ratio_c": clip_c})
    lp = t(NEW, grad=True)
    loss, metrics = fn(t(OLD), lp, t(ADV), t(MASK), "token-mean", cfg)
    exp_loss, exp_grad, exp_metrics = np_dppo(OLD, NEW, ADV, MASK, 0.1, 0.15, clip_c, kind)
    loss.backward()
    assert loss.item() == pytest.approx(exp_loss, rel=1e-12)
    np.testing.assert_allclose(lp.grad.numpy(), exp_grad, rtol=1e-12, atol=1e-15)
    assert metrics == pytest.approx(exp_metrics, rel=1e-12)
    assert 0 < metrics["actor/pg_clipfrac"] < 1  # the example does leave the trust region on some tokens


def test_dppo_tv_by_hand():
    # p_old = 0.5 on both tokens; token 0 rises to 0.8 (Δp = 0.3 > δ_high = 0.15, A > 0: dropped),
    # token 1 rises to 0.6 (Δp = 0.1: kept, r = 1.2). loss = -(A·r·logπ) on token 1 / 2 tokens.
    old, new, adv = np.log([[0.5, 0.5]]), np.log([[0.8, 0.6]]), np.array([[1.0, 2.0]])
    loss, metrics = compute_policy_loss_dppo_tv(t(old), t(new), t(adv), t([[1, 1]]), "token-mean", CFG)
    assert loss.item() == pytest.approx(-(2.0 * 1.2 * np.log(0.6)) / 2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_dppo_uses_a_20_cap_when_the_config_has_no_clip_ratio_c():
    old, new, adv = np.log([[0.01]]), np.log([[0.5]]), np.array([[-1.0]])  # r = 50, A < 0, Δp > 0: kept
    loss, metrics = compute_policy_loss_dppo_tv(t(old), t(new), t(adv), t([[1]]), "token-mean", {"clip_ratio": 0.9})
    assert loss.item() == pytest.approx(20.0 * np.log(0.5))
    assert metrics["actor/pg_clipfrac_lower"] == 1.0


def test_dppo_rollout_is_weights_multiply_the_per_token_loss():
    base, _ = compute_policy_loss_dppo_kl(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", CFG)
    half, _ = compute_policy_loss_dppo_kl(
        t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", CFG, t(np.full_like(MASK, 0.5))
    )
    assert half.item() == pytest.approx(0.5 * base.item(), rel=1e-12)


# ------------------------------------------------------------------------------------------ bypass mode
def corr_cfg(**corr):
    return SimpleNamespace(**vars(CFG), policy_loss=SimpleNamespace(rollout_correction=SimpleNamespace(**corr)))


def np_offpolicy(train, roll, m):
    lr = train - roll
    rows = m.sum(-1) > 0
    train_row = (train * m).sum(-1) / m.sum(-1)
    roll_row = (roll * m).sum(-1) / m.sum(-1)
    return {
        "rollout_corr/kl": masked_mean(roll - train, m),
        "rollout_corr/k3_kl": masked_mean(np.exp(lr) - lr - 1, m),
        "rollout_corr/training_ppl": np.exp(-train_row[rows]).mean(),
        "rollout_corr/rollout_ppl": np.exp(-roll_row[rows]).mean(),
        "rollout_corr/chi2_token": masked_mean(np.exp(lr) ** 2, m) - 1,
        "rollout_corr/chi2_seq": np.exp(2 * np.clip((lr * m).sum(-1), -20, 20)).mean() - 1,
    }


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_policy_plus_mismatch_metrics():
    cfg = corr_cfg(loss_type="ppo_clip", rollout_is="sequence", rollout_is_threshold=2.0)
    lp_a, lp_b = t(NEW, grad=True), t(NEW, grad=True)
    loss, metrics = compute_policy_loss_bypass_mode(t(OLD), lp_a, t(ADV), t(MASK), "token-mean", cfg)
    ref, ref_metrics = compute_policy_loss_vanilla(t(OLD), lp_b, t(ADV), t(MASK), "token-mean", cfg)
    loss.backward()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    np.testing.assert_allclose(lp_a.grad.numpy(), lp_b.grad.numpy(), rtol=1e-12)  # no IS weights applied
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value)
    for key, value in np_offpolicy(NEW, OLD, MASK).items():
        assert metrics[key] == pytest.approx(value, rel=1e-9), key
    seq_w = np.minimum(np.exp(((NEW - OLD) * MASK).sum(-1)), 2.0)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(masked_mean(seq_w[:, None] * MASK, MASK))


@pytest.mark.parametrize(
    ("level", "threshold", "normalize"),
    [("token", 2.0, False), ("sequence", 1.5, False), ("token", "0.8_1.25", False), ("token", 2.0, True)],
)
def test_bypass_reinforce_applies_the_importance_weights(level, threshold, normalize):
    cfg = corr_cfg(
        loss_type="reinforce", rollout_is=level, rollout_is_threshold=threshold, rollout_is_batch_normalize=normalize
    )
    lp = t(NEW, grad=True)
    loss, metrics = compute_policy_loss_bypass_mode(t(OLD), lp, t(ADV), t(MASK), "token-mean", cfg)
    lr = NEW - OLD
    raw = np.exp(lr) if level == "token" else np.repeat(np.exp((lr * MASK).sum(-1, keepdims=True)), 5, axis=1)
    raw = raw * MASK
    if isinstance(threshold, str):
        lo, hi = (float(x) for x in threshold.split("_"))
        w = np.where((raw >= lo) & (raw <= hi), raw, 0.0)
    else:
        w = np.minimum(raw, threshold)
    if normalize:
        w = w / masked_mean(w, MASK)
    loss.backward()
    assert loss.item() == pytest.approx(masked_mean(-w * ADV * NEW, MASK), rel=1e-12)
    np.testing.assert_allclose(lp.grad.numpy(), -w * ADV * MASK / MASK.sum(), rtol=1e-12, atol=1e-15)
    assert metrics["actor/ppo_kl"] == pytest.approx(masked_mean(OLD - NEW, MASK))


def test_reinforce_without_weights_is_plain_policy_gradient():
    loss, _ = compute_policy_loss_reinforce(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", CFG)
    assert loss.item() == pytest.approx(masked_mean(-ADV * NEW, MASK))
    cfg = corr_cfg(loss_type="reinforce", rollout_is=None)
    assert compute_policy_loss_bypass_mode(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", cfg)[0].item() == (
        pytest.approx(loss.item())
    )


def test_bypass_errors_name_the_setting():
    with pytest.raises(ValueError, match="rollout_correction"):
        compute_policy_loss_bypass_mode(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", CFG)
    with pytest.raises(ValueError, match="loss_type"):
        compute_policy_loss_bypass_mode(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", corr_cfg(loss_type="ppo"))
    with pytest.raises(ValueError, match="rollout_rs='token_k1' needs rollout_rs_threshold"):
        compute_policy_loss_bypass_mode(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", corr_cfg(rollout_rs="token_k1"))
    with pytest.raises(ValueError, match="rollout_is must be one of"):
        compute_rollout_correction_weights(t(NEW - OLD), t(MASK), rollout_is="geo")


@pytest.mark.parametrize(
    ("spec", "expected"), [(2.0, (2.0, None)), ("3", (3.0, None)), ("0.5_2.0", (2.0, 0.5)), (4, (4.0, None))]
)
def test_threshold_parsing(spec, expected):
    assert parse_rollout_is_threshold(spec) == expected


@pytest.mark.parametrize(
    ("spec", "error"), [(True, TypeError), ("x", ValueError), ("2_1", ValueError), (0, ValueError)]
)
def test_bad_thresholds_are_refused(spec, error):
    with pytest.raises(error):
        parse_rollout_is_threshold(spec)


def test_registered_under_verl_names():
    assert get_policy_loss_fn("dppo_tv") is compute_policy_loss_dppo_tv
    assert get_policy_loss_fn("dppo_kl") is compute_policy_loss_dppo_kl
    assert get_policy_loss_fn("bypass_mode") is compute_policy_loss_bypass_mode


# ------------------------------------------------------------------------------------ actor loss path
@pytest.mark.parametrize("loss_mode", ["dppo_tv", "dppo_kl", "bypass_mode"])
def test_the_actor_loss_reads_the_schema_keys(loss_mode):
    """make_ppo_loss with the real ActorConfig: the loss sees policy_loss.rollout_correction and the clip keys."""
    import attrs

    from verl.config.schema.actor import ActorConfig, PolicyLossConfig, PolicyLossRolloutCorrectionConfig
    from verl.protocol import DataProto
    from verl.workers.losses import make_ppo_loss

    corr = PolicyLossRolloutCorrectionConfig(loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.5)
    actor = attrs.evolve(
        ActorConfig(),
        clip_ratio_low=0.1,
        clip_ratio_high=0.15,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, rollout_correction=corr),
    )
    micro = DataProto.from_dict(tensors={"old_log_probs": t(OLD), "advantages": t(ADV), "response_mask": t(MASK)})
    norm = {"dp_size": 1, "batch_num_tokens": int(MASK.sum()), "global_batch_size": 4}
    loss, metrics = make_ppo_loss(actor)(micro, {"log_probs": t(NEW)}, norm)
    if loss_mode == "bypass_mode":
        w = np.minimum(np.exp(NEW - OLD), 1.5) * MASK
        expected = masked_mean(-w * ADV * NEW, MASK)
        assert "rollout_corr/rollout_is_mean" in metrics
    else:
        expected = np_dppo(OLD, NEW, ADV, MASK, 0.1, 0.15, 3.0, "tv" if loss_mode == "dppo_tv" else "kl")[0]
    assert loss.item() == pytest.approx(expected, rel=1e-12)
