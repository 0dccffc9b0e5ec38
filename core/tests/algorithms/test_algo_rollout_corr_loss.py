"""Rollout correction in the losses: every policy loss multiplies by ``rollout_is_weights`` (verl), the
actor loss carries the column from the micro-batch, bypass mode reads algorithm.rollout_correction, and the
driver-side batch step adds the weights and masks response_mask."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from verl.algorithms import get_policy_loss_fn
from verl.algorithms.registry import local_names
from verl.algorithms.rollout_correction import compute_rollout_correction_and_add_to_batch
from verl.config.schema import ActorConfig, PolicyLossConfig
from verl.config.schema.algorithm import RolloutCorrectionConfig
from verl.protocol import DataProto
from verl.workers.losses import make_ppo_loss

RNG = np.random.default_rng(11)
OLD = np.log(RNG.uniform(0.05, 0.9, (4, 5)))
NEW = np.minimum(OLD + RNG.normal(0, 0.4, (4, 5)), -1e-3)
ADV = RNG.normal(size=(4, 5))
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=np.float64)
W = RNG.uniform(0.2, 2.0, (4, 5)) * MASK
# Losses whose per-token loss depends on the token's own log-prob only (the others mix a row's tokens).
NOT_PER_TOKEN = {"geo_mean", "bypass_mode"}
CONFIG = {"policy_loss": {"dro_beta": 0.1}, "clip_ratio": 0.2}


def t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


def masked_mean(x, m=MASK):
    return (x * m).sum() / m.sum()


def _grad(name, weights):
    torch.manual_seed(0)  # clip_cov picks its tokens at random: the same picks with and without weights
    lp = t(NEW, grad=True)
    loss, _ = get_policy_loss_fn(name)(t(OLD), lp, t(ADV), t(MASK), "token-mean", CONFIG, weights)
    loss.backward()
    return loss.item(), lp.grad.numpy()


@pytest.mark.parametrize("name", sorted(set(local_names("policy_loss")) - NOT_PER_TOKEN))
def test_every_per_token_loss_scales_each_tokens_gradient_by_its_weight(name):
    _, plain = _grad(name, None)
    _, weighted = _grad(name, t(W))
    np.testing.assert_allclose(weighted, W * plain, rtol=1e-10, atol=1e-14)
    assert np.abs(plain[MASK > 0]).max() > 0, name  # a loss with no gradient here would pass trivially


def test_geo_mean_weights_enter_as_the_rows_geometric_mean():
    # A constant weight c has geometric mean c in every row: the loss scales by c.
    plain, _ = _grad("geo_mean", None)
    scaled, _ = _grad("geo_mean", t(0.3 * MASK + (1 - MASK)))
    assert scaled == pytest.approx(0.3 * plain, rel=1e-12)


def test_bypass_mode_ignores_precomputed_weights_as_verl():
    cfg = {**CONFIG, "policy_loss": {"rollout_correction": {"loss_type": "reinforce", "rollout_is": None}}}
    fn = get_policy_loss_fn("bypass_mode")
    plain, _ = fn(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", cfg)
    weighted, _ = fn(t(OLD), t(NEW), t(ADV), t(MASK), "token-mean", cfg, t(W))
    assert weighted.item() == pytest.approx(plain.item(), rel=1e-12)


def _micro(**extra):
    tensors = {"old_log_probs": t(OLD), "advantages": t(ADV), "response_mask": t(MASK), **extra}
    return DataProto.from_dict(tensors=tensors)


NORM = {"dp_size": 1, "batch_num_tokens": int(MASK.sum()), "global_batch_size": 4}


def test_the_actor_loss_multiplies_the_vanilla_per_token_loss_by_the_micro_batch_weights():
    actor = ActorConfig()  # vanilla, clip 0.2, dual clip 3, token-mean
    loss, _ = make_ppo_loss(actor)(_micro(rollout_is_weights=t(W)), {"log_probs": t(NEW)}, NORM)
    ratio = np.exp(NEW - OLD)
    clipped = np.maximum(-ADV * ratio, -ADV * np.clip(ratio, 0.8, 1.2))
    per_token = np.where(ADV < 0, np.minimum(clipped, -ADV * 3.0), clipped)
    assert loss.item() == pytest.approx(masked_mean(W * per_token), rel=1e-12)
    plain, _ = make_ppo_loss(actor)(_micro(), {"log_probs": t(NEW)}, NORM)
    assert plain.item() == pytest.approx(masked_mean(per_token), rel=1e-12)
    assert abs(plain.item() - loss.item()) > 1e-3  # the weights matter on this batch


def test_bypass_mode_swaps_the_loss_and_reads_the_algorithm_section():
    corr = RolloutCorrectionConfig(
        bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.5
    )
    actor = ActorConfig()  # loss_mode vanilla; policy_loss.rollout_correction keeps its defaults (sequence, ppo_clip)
    micro = _micro()  # in bypass mode old_log_probs are the rollout's
    loss, metrics = make_ppo_loss(actor, rollout_correction=corr)(micro, {"log_probs": t(NEW)}, NORM)
    w = np.minimum(np.exp(NEW - OLD), 1.5) * MASK
    assert loss.item() == pytest.approx(masked_mean(-w * ADV * NEW), rel=1e-12)
    assert "rollout_corr/rollout_is_mean" in metrics
    # Without bypass mode the section does not touch the loss (the trainer applies it on the driver).
    off = attrs.evolve(corr, bypass_mode=False)
    vanilla, _ = make_ppo_loss(actor, rollout_correction=off)(micro, {"log_probs": t(NEW)}, NORM)
    assert vanilla.item() == pytest.approx(make_ppo_loss(actor)(micro, {"log_probs": t(NEW)}, NORM)[0].item())
    assert actor.policy_loss == PolicyLossConfig()  # the caller's config is not changed


def test_bypass_mode_rejection_leaves_the_loss_mask():
    # ppo_clip with token_k2 rejection: the vanilla loss on the kept tokens, normalised by the batch's tokens.
    corr = RolloutCorrectionConfig(bypass_mode=True, rollout_rs="token_k2", rollout_rs_threshold=0.02)
    loss, metrics = make_ppo_loss(ActorConfig(), rollout_correction=corr)(_micro(), {"log_probs": t(NEW)}, NORM)
    keep = (0.5 * (NEW - OLD) ** 2 <= 0.02) * MASK
    ratio = np.exp(NEW - OLD)
    clipped = np.maximum(-ADV * ratio, -ADV * np.clip(ratio, 0.8, 1.2))
    per_token = np.where(ADV < 0, np.minimum(clipped, -ADV * 3.0), clipped)
    assert loss.item() == pytest.approx((per_token * keep).sum() / MASK.sum(), rel=1e-12)
    assert 0 < keep.sum() < MASK.sum()
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] > 0


def test_driver_step_adds_the_weights_and_masks_the_response_mask():
    roll = OLD - 0.3 * (NEW - OLD)
    batch = DataProto.from_dict(
        tensors={"old_log_probs": t(OLD), "rollout_log_probs": t(roll), "response_mask": t(MASK)}
    )
    corr = RolloutCorrectionConfig(rollout_is="sequence", rollout_rs="seq_max_k2", rollout_rs_threshold=0.01)
    out, metrics = compute_rollout_correction_and_add_to_batch(batch, corr)
    lr = OLD - roll
    w = np.minimum(np.exp((lr * MASK).sum(-1, keepdims=True)), 2.0) * MASK
    keep_rows = np.where(MASK > 0, 0.5 * lr**2, -np.inf).max(-1) <= 0.01
    np.testing.assert_allclose(out.batch["rollout_is_weights"].numpy(), w, rtol=1e-12)
    np.testing.assert_array_equal(out.batch["response_mask"].numpy(), MASK * keep_rows[:, None])
    assert 0 < keep_rows.sum() < 4
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 - keep_rows.mean())
    assert metrics["rollout_corr/kl"] == pytest.approx(masked_mean(roll - OLD))


def test_driver_step_without_is_adds_no_weights_and_reads_a_mapping_like_verl():
    batch = DataProto.from_dict(
        tensors={"old_log_probs": t(OLD), "rollout_log_probs": t(NEW), "response_mask": t(MASK)}
    )
    out, metrics = compute_rollout_correction_and_add_to_batch(batch, {"rollout_is": "token"})
    assert out.batch["rollout_is_weights"].shape == (4, 5)  # threshold missing: verl's default 2.0
    batch = DataProto.from_dict(
        tensors={"old_log_probs": t(OLD), "rollout_log_probs": t(NEW), "response_mask": t(MASK)}
    )
    out, metrics = compute_rollout_correction_and_add_to_batch(batch, RolloutCorrectionConfig())
    assert "rollout_is_weights" not in out.batch.keys() and "rollout_corr/k3_kl" in metrics
    with pytest.raises(KeyError, match="rollout_log_probs"):
        compute_rollout_correction_and_add_to_batch(
            DataProto.from_dict(tensors={"old_log_probs": t(OLD), "response_mask": t(MASK)}), RolloutCorrectionConfig()
        )
