"""Clipped value loss against numpy, and the name registries (local first, then plugins)."""

import sys
import types
import uuid

import numpy as np
import pytest
import torch

from verl.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    compute_value_loss,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from verl.algorithms.advantage import AdvantageEstimator


def t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


# ------------------------------------------------------------------------------------------ value loss
V_PRED = np.array([[1.0, 0.2, -0.5, 3.0], [0.0, 2.0, 1.0, 1.0]])
RET = np.array([[0.5, 0.5, 0.5, 0.5], [1.0, 1.0, -1.0, 9.0]])
V_OLD = np.array([[0.0, 0.3, -0.4, 1.0], [0.1, 1.0, 1.2, 7.0]])
MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=float)


def np_value_loss(c):
    clipped = np.clip(V_PRED, V_OLD - c, V_OLD + c)
    l1, l2 = (V_PRED - RET) ** 2, (clipped - RET) ** 2
    return 0.5 * (np.maximum(l1, l2) * MASK).sum() / MASK.sum(), ((l2 > l1) * MASK).sum() / MASK.sum()


@pytest.mark.parametrize("clip", [0.0, 0.2, 0.5, 100.0])
def test_value_loss_matches_numpy(clip):
    loss, clipfrac = compute_value_loss(t(V_PRED), t(RET), t(V_OLD), t(MASK), cliprange_value=clip)
    exp_loss, exp_cf = np_value_loss(clip)
    assert loss.item() == pytest.approx(exp_loss, rel=1e-12)
    assert clipfrac.item() == pytest.approx(exp_cf)


def test_value_loss_by_hand_and_gradient():
    # v=1, R=0, V_old=0, c=0.5: (1-0)^2 = 1 vs (0.5-0)^2 -> max 1 -> 0.5; grad = 0.5*2*(v-R) = 1
    v = t([[1.0]], grad=True)
    loss, clipfrac = compute_value_loss(v, t([[0.0]]), t([[0.0]]), t([[1]]), 0.5)
    assert loss.item() == pytest.approx(0.5)
    assert clipfrac.item() == 0.0
    loss.backward()
    assert v.grad.item() == pytest.approx(1.0)
    # v=0.2, R=2, V_old=0, c=0.1: unclipped 3.24, clipped (0.1-2)^2 = 3.61 -> clipped wins, no grad through v
    v = t([[0.2]], grad=True)
    loss, clipfrac = compute_value_loss(v, t([[2.0]]), t([[0.0]]), t([[1]]), 0.1)
    assert loss.item() == pytest.approx(0.5 * 3.61)
    assert clipfrac.item() == 1.0
    loss.backward()
    assert v.grad.item() == 0.0


def test_value_loss_global_normalisation_and_errors():
    half = compute_value_loss(t(V_PRED), t(RET), t(V_OLD), t(MASK), 0.5, dp_size=2, batch_num_tokens=14)[0]
    assert half.item() == pytest.approx(np_value_loss(0.5)[0] * 7 / 14 * 2)
    with pytest.raises(ValueError, match="cliprange_value"):
        compute_value_loss(t(V_PRED), t(RET), t(V_OLD), t(MASK), -0.1)
    with pytest.raises(ValueError, match="returns shape"):
        compute_value_loss(t(V_PRED), t(RET[:, :2]), t(V_OLD), t(MASK), 0.5)


# ------------------------------------------------------------------------------------------ registries
def unique(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_builtins_are_registered_under_verl_names():
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is compute_grpo_outcome_advantage
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    expected = {"gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"}
    assert expected | {"opo", "gpg"} <= set(ADV_ESTIMATOR_REGISTRY)


def test_register_and_reregister_rules():
    name = unique("est")

    def est(**kwargs):
        return "mine"

    assert register_adv_est(name)(est) is est
    assert register_adv_est(name)(est) is est  # same function again is fine
    assert get_adv_estimator_fn(name) is est
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est(name)(lambda **kw: None)
    loss_name = unique("loss")
    register_policy_loss(loss_name)(est)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss(loss_name)(lambda **kw: None)
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(est)
    with pytest.raises(TypeError):
        register_adv_est("")


def test_unknown_names_list_registered_ones():
    with pytest.raises(ValueError, match="grpo") as err:
        get_adv_estimator_fn("no_such_estimator")
    assert "no_such_estimator" in str(err.value)
    with pytest.raises(ValueError, match="vanilla"):
        get_policy_loss_fn("no_such_loss")


class FakeManager:
    """A stand-in plugin manager (``get``/``available`` only, the real manager's error layout)."""

    def __init__(self, available):
        self._available = available

    def get(self, kind, name):
        if (kind, name) in self._available:
            return types.SimpleNamespace(name=name, fn=self._available[(kind, name)])
        raise ValueError(
            f"unknown {kind} {name!r}; available: ...\n"
            "Plugins that failed to load (one of them may provide it):\n  - broken-dist 0.1 [import]: ImportError"
        )

    def available(self, kind):
        return {n: None for (k, n) in self._available if k == kind}


def test_plugin_fallback_after_local_registry():
    from verl.plugins import get_adv_estimator_fn as plugin_adv
    from verl.plugins import get_policy_loss_fn as plugin_loss_fn

    def plugin_est(**kwargs):
        return "plugin"

    def plugin_loss(*args, **kwargs):
        return "loss"

    pm = FakeManager({("advantage_estimator", "plugin_est"): plugin_est, ("policy_loss", "plugin_loss"): plugin_loss})
    assert plugin_adv("plugin_est", plugin_manager=pm) is plugin_est
    assert plugin_loss_fn("plugin_loss", plugin_manager=pm) is plugin_loss
    assert plugin_adv("grpo", plugin_manager=pm) is compute_grpo_outcome_advantage  # local wins
    with pytest.raises(ValueError) as err:
        plugin_adv("missing", plugin_manager=pm)
    assert "plugin_est" in str(err.value) and "broken-dist" in str(err.value) and "grpo" in str(err.value)


def test_algorithms_lookup_is_the_local_registry_only(monkeypatch):
    """verl.algorithms never asks the plugin system (it is a lower layer): it works with verl.plugins unimportable."""
    monkeypatch.setitem(sys.modules, "verl.plugins", None)  # import now raises ImportError
    with pytest.raises(ValueError, match="verl.plugins.get_adv_estimator_fn"):
        get_policy_loss_fn("missing")
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla


def test_real_plugin_manager_serves_builtins():
    plugins = pytest.importorskip("verl.plugins")
    spec = plugins.get_plugin_manager().get("advantage_estimator", "grpo")
    assert spec.fn is compute_grpo_outcome_advantage
