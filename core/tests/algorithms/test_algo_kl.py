"""KL estimators, controllers, in-reward KL (K22 maths) and the actor-loss sign convention (K10)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.algorithms import (
    KL_PENALTY_MODES,
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    combine_actor_loss,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
)

LOGP = np.array([[-1.0, -0.2, -3.0, -0.7]])
REF = np.array([[-1.5, -0.2, -0.1, -2.0]])


def t(x, grad=False, dtype=torch.float64):
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=dtype, requires_grad=grad)


def np_kl(logp, ref, mode):
    d = logp - ref
    if mode in ("kl", "k1"):
        return d
    if mode == "abs":
        return np.abs(d)
    if mode in ("mse", "k2"):
        return 0.5 * d**2
    x = np.clip(ref - logp, -20, 20)
    return np.clip(np.exp(x) - x - 1, -10, 10)


@pytest.mark.parametrize("mode", KL_PENALTY_MODES)
def test_values_match_numpy(mode):
    got = kl_penalty(t(LOGP), t(REF), mode).detach().numpy()
    np.testing.assert_allclose(got, np_kl(LOGP, REF, mode.rstrip("+")), rtol=1e-12, atol=1e-15)


def test_by_hand_values():
    out = {m: kl_penalty(t([[0.0]]), t([[np.log(0.5)]]), m).item() for m in ("k1", "abs", "k2", "k3")}
    d = -np.log(0.5)
    assert out["k1"] == pytest.approx(d)
    assert out["abs"] == pytest.approx(d)
    assert out["k2"] == pytest.approx(0.5 * d * d)
    assert out["k3"] == pytest.approx(0.5 - np.log(0.5) - 1)  # ratio 0.5, x = log 0.5


@pytest.mark.parametrize("mode", ["kl+", "k1+", "abs+", "low_var_kl+", "k3+", "mse+", "k2+"])
def test_plus_variants_use_the_k2_gradient(mode):
    logp = t(LOGP, grad=True)
    kl_penalty(logp, t(REF), mode).sum().backward()
    np.testing.assert_allclose(logp.grad.numpy(), LOGP - REF, rtol=1e-12)  # d/dlogp of ½(logp − ref)²


@pytest.mark.parametrize("mode", KL_PENALTY_MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("delta", [1000.0, -1000.0])
def test_extreme_log_ratios_finite_values_and_gradients(mode, dtype, delta):
    ref = torch.full((2, 3), -1.0, dtype=dtype)
    logp = (ref.detach().float() + delta).to(dtype).requires_grad_(True)
    out = kl_penalty(logp, ref, mode)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert torch.isfinite(logp.grad).all()
    if mode.rstrip("+") in ("low_var_kl", "k3"):
        assert out.max().item() <= 10.0


def test_unknown_and_full_modes_raise_value_error():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(t(LOGP), t(REF), "k4")
    with pytest.raises(ValueError, match="full"):
        kl_penalty(t(LOGP), t(REF), "full")


def test_compute_rewards():
    out = compute_rewards(t([[0.0, 1.0]]), t([[-1.0, -2.0]]), t([[-1.5, -2.0]]), 0.1)
    np.testing.assert_allclose(out.numpy(), [[-0.05, 1.0]])


# ------------------------------------------------------------------------------------------ controllers
def test_fixed_controller_is_constant():
    ctrl = FixedKLController(0.001)
    ctrl.update(current_kl=5.0, n_steps=100)
    assert ctrl.value == 0.001


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=0.06, n_steps=10)  # e = 0.2 -> ×(1 + 0.2·10/100) = 1.02
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=1.0, n_steps=10)  # e clipped to 0.2
    assert ctrl.value == pytest.approx(0.102 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=50)  # e = -1 -> clipped to -0.2 -> ×0.9
    assert ctrl.value == pytest.approx(0.102 * 1.02 * 0.9)


def test_controller_validation_and_factory():
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 10)
    assert isinstance(get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.01)), FixedKLController)
    ada = get_kl_controller({"type": "adaptive", "kl_coef": 0.2, "horizon": 50, "target_kl": 0.3})
    assert (ada.value, ada.horizon, ada.target) == (0.2, 50, 0.3)
    with pytest.raises(ValueError, match="adaptive"):
        get_kl_controller({"type": "pid"})


# ------------------------------------------------------------------------------------------ K22 (maths)
def kl_batch(scores, old, ref, mask):
    return SimpleNamespace(
        batch={
            "token_level_scores": t(scores),
            "old_log_probs": t(old),
            "ref_log_prob": t(ref),
            "response_mask": t(mask),
        },
        non_tensor_batch={},
    )


def test_k22b_in_reward_kl_penalty():
    old = np.array([[0.1, 0.2, 0.3]])  # per-token k1 KL [0.1, 0.2, 0.3] against ref 0
    data, metrics = apply_kl_penalty(
        kl_batch([[0, 0, 1.0]], old, np.zeros((1, 3)), [[1, 1, 1]]), FixedKLController(0.001)
    )
    np.testing.assert_allclose(data.batch["token_level_rewards"].numpy(), [[-0.0001, -0.0002, 0.9997]], rtol=1e-12)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.001
    np.testing.assert_allclose(data.batch["token_level_scores"].numpy(), [[0, 0, 1.0]])  # scores untouched


def test_apply_kl_penalty_reads_beta_before_the_adaptive_update_and_masks():
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.01, horizon=10)
    old = np.array([[0.1, 0.3, 9.0], [0.2, 0.2, 0.2], [5.0, 5.0, 5.0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    data, metrics = apply_kl_penalty(kl_batch(np.zeros((3, 3)), old, np.zeros((3, 3)), mask), ctrl, "kl")
    np.testing.assert_allclose(data.batch["token_level_rewards"].numpy(), -0.5 * old * mask)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.2)  # rows 0.2, 0.2; empty row left out
    assert ctrl.value == pytest.approx(0.5 * (1 + 0.2 * 3 / 10))


def test_apply_kl_penalty_names_missing_keys():
    data = SimpleNamespace(batch={"token_level_scores": t([[0.0]])}, non_tensor_batch={})
    with pytest.raises(KeyError, match="ref_log_prob"):
        apply_kl_penalty(data, FixedKLController(0.1))


def test_apply_kl_penalty_on_a_real_dataproto():
    protocol = pytest.importorskip("verl.protocol")
    data = protocol.DataProto.from_dict(
        tensors={
            "token_level_scores": t([[0, 0, 1.0]]),
            "old_log_probs": t([[0.1, 0.2, 0.3]]),
            "ref_log_prob": t([[0.0, 0.0, 0.0]]),
            "response_mask": t([[1, 1, 1]]),
        }
    )
    out, _ = apply_kl_penalty(data, FixedKLController(0.001))
    np.testing.assert_allclose(out.batch["token_level_rewards"].numpy(), [[-0.0001, -0.0002, 0.9997]], rtol=1e-12)


# ------------------------------------------------------------------------------------------ K10
def test_k10_kl_loss_is_added():
    pg, kl = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    total = combine_actor_loss(pg, kl, kl_coef=0.1)
    assert total.item() == pytest.approx(0.32)
    total.backward()
    assert kl.grad.item() == pytest.approx(0.1)
    assert combine_actor_loss(0.3, 0.2, 0.1) == pytest.approx(0.32)


def test_entropy_bonus_is_subtracted_and_negative_kl_coef_rejected():
    ent = torch.tensor(2.0, requires_grad=True)
    total = combine_actor_loss(torch.tensor(0.3), None, 0.0, ent, entropy_coeff=0.01)
    assert total.item() == pytest.approx(0.28)
    total.backward()
    assert ent.grad.item() == pytest.approx(-0.01)
    with pytest.raises(ValueError, match="kl_loss_coef"):
        combine_actor_loss(0.3, 0.2, -0.1)


@pytest.mark.parametrize("mode", ["low_var_kl", "k1", "k2", "k3+"])
def test_k10_sgd_step_with_zero_advantage_moves_towards_reference(mode):
    """Toy policy over 3 tokens; the sampled token is over-weighted relative to the reference."""
    logits = torch.tensor([2.0, 0.0, -1.0], dtype=torch.float64, requires_grad=True)
    ref_logp = torch.log_softmax(torch.tensor([0.0, 0.5, 0.0], dtype=torch.float64), -1)

    def true_kl(z):
        logp = torch.log_softmax(z, -1)
        return (logp.exp() * (logp - ref_logp)).sum()

    before = true_kl(logits).item()
    logp = torch.log_softmax(logits, -1)[:1].unsqueeze(0)  # sampled token 0, one response token
    mask = torch.ones(1, 1)
    advantages = torch.zeros(1, 1, dtype=torch.float64)
    pg_loss = agg_loss(-advantages * logp, mask, "token-mean")
    kl_loss = agg_loss(kl_penalty(logp, ref_logp[:1].unsqueeze(0), mode), mask, "token-mean")
    combine_actor_loss(pg_loss, kl_loss, kl_coef=0.5).backward()
    with torch.no_grad():
        stepped = logits - 0.1 * logits.grad
    assert true_kl(stepped).item() < before


# ------------------------------------------------------------------------------------------ non-finite padding
@pytest.mark.parametrize("mode", KL_PENALTY_MODES)
@pytest.mark.parametrize("bad", [float("-inf"), float("inf"), float("nan")])
@pytest.mark.parametrize("where", ["ref", "logp"])
def test_nonfinite_padded_slots_do_not_poison_gradients(mode, bad, where):
    # Slot 1 is padding holding -inf/inf/NaN; the valid slot's gradient must be the usual one and the
    # padded slot's gradient 0, both through agg_loss (torch.where) and through a plain mask multiply.
    logp_v, ref_v = np.array([[-1.0, -2.0]]), np.array([[-1.5, -0.3]])
    if where == "ref":
        ref_v[0, 1] = bad
    else:
        logp_v[0, 1] = bad
    mask = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    d = -1.0 - -1.5  # d = logp - ref on the valid slot
    if mode.endswith("+") or mode.rstrip("+") in ("mse", "k2"):
        want = d  # d/dlogp of ½d²
    elif mode in ("kl", "k1", "abs"):
        want = 1.0  # d > 0
    else:
        want = 1.0 - np.exp(-d)  # d/dlogp of e^{-d} + d - 1
    for reduce in ("agg_loss", "multiply"):
        logp = t(logp_v, grad=True)
        kl = kl_penalty(logp, t(ref_v), mode)
        # A plain multiply leaves a NaN *value* (inf * 0), which is the caller's business; the gradient
        # reaching the padded slot is 0 and must stay 0, not 0 * inf.
        loss = agg_loss(kl, mask, "token-sum") if reduce == "agg_loss" else (kl * mask).sum()
        loss.backward()
        assert torch.isfinite(logp.grad).all(), (reduce, logp.grad)
        np.testing.assert_allclose(logp.grad.numpy(), [[want, 0.0]], rtol=1e-12, atol=0)
    # Finite slots keep their exact values.
    value = kl_penalty(t(logp_v), t(ref_v), mode)[0, 0].item()
    assert value == pytest.approx(float(np_kl(np.array([-1.0]), np.array([-1.5]), mode.rstrip("+"))[0]))
