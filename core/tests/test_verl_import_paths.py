"""verl's import paths (``verl.trainer.ppo.core_algos``, ``verl.utils.reward_score``) work and give the very
objects of ``verl.algorithms`` / ``verl.rewards`` (issue #15: verl users' code carries over)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import verl.algorithms as algorithms
import verl.rewards.gsm8k as rewards_gsm8k
import verl.rewards.math as rewards_math
from verl.rewards import default_compute_score as rewards_default

# The public names of verl's verl/trainer/ppo/core_algos.py (module-level functions, classes and registries,
# verl main as of the mirror used for this package), copied here so the check needs no verl checkout.
VERL_CORE_ALGOS = {
    "PolicyLossFn",
    "POLICY_LOSS_REGISTRY",
    "register_policy_loss",
    "get_policy_loss_fn",
    "AdvantageEstimator",
    "ADV_ESTIMATOR_REGISTRY",
    "register_adv_est",
    "get_adv_estimator_fn",
    "AdaptiveKLController",
    "FixedKLController",
    "get_kl_controller",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_gdpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_rewards",
    "agg_loss",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_gspo",
    "compute_policy_loss_sapo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_dro",
    "compute_policy_loss_cispo",
    "compute_entropy_loss",
    "compute_value_loss",
    "kl_penalty",
    "kl_penalty_forward",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_bypass_mode",
}
# Named as not provided in core_algos' docstring.
LACKING = {"compute_policy_loss", "compute_pf_ppo_reweight_data"}


def test_core_algos_import_line_of_verl_users():
    from verl.trainer.ppo.core_algos import (
        AdvantageEstimator,
        agg_loss,
        compute_grpo_outcome_advantage,
        get_adv_estimator_fn,
        get_policy_loss_fn,
        kl_penalty,
        register_adv_est,
        register_policy_loss,
    )

    assert AdvantageEstimator is algorithms.AdvantageEstimator
    assert agg_loss is algorithms.agg_loss and kl_penalty is algorithms.kl_penalty
    assert compute_grpo_outcome_advantage is algorithms.compute_grpo_outcome_advantage
    # The plugin-aware lookups (local registry first, as verl's, then plugin-provided names).
    import verl.plugins

    assert get_adv_estimator_fn is verl.plugins.get_adv_estimator_fn
    assert get_policy_loss_fn is verl.plugins.get_policy_loss_fn
    assert register_adv_est is algorithms.register_adv_est and register_policy_loss is algorithms.register_policy_loss
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is algorithms.compute_grpo_outcome_advantage


def test_core_algos_has_every_verl_name_but_the_listed_ones():
    import verl.trainer.ppo.core_algos as core_algos

    provided = set(core_algos.__all__)
    assert provided == VERL_CORE_ALGOS - LACKING
    for name in LACKING:
        assert name in core_algos.__doc__ and not hasattr(core_algos, name)
    import verl.plugins

    for name in provided - {"PolicyLossFn", "kl_penalty_forward"}:  # defined in the shim itself
        # The two lookups are the plugin-aware ones of verl.plugins (local registry first, then plugins).
        source = verl.plugins if name in ("get_adv_estimator_fn", "get_policy_loss_fn") else algorithms
        assert getattr(core_algos, name) is getattr(source, name), name


def test_an_estimator_registered_through_verls_path_is_found_by_name():
    from verl.trainer.ppo import core_algos

    @core_algos.register_adv_est("h11_test_estimator")
    def estimator(**kwargs):
        return kwargs

    try:
        assert algorithms.get_adv_estimator_fn("h11_test_estimator") is estimator
        assert algorithms.ADV_ESTIMATOR_REGISTRY is core_algos.ADV_ESTIMATOR_REGISTRY
    finally:
        del algorithms.ADV_ESTIMATOR_REGISTRY["h11_test_estimator"]


@pytest.mark.parametrize("mode", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_penalty_forward_is_verls_formula(mode):
    from verl.trainer.ppo.core_algos import kl_penalty_forward

    rng = np.random.default_rng(0)
    logprob, ref = -rng.random((3, 5)) * 4, -rng.random((3, 5)) * 4
    d = logprob - ref
    x = np.clip(-d, -20, 20)  # verl: kl = ref - logprob, clamped to +-20; exp(kl) - kl - 1, clamped to +-10
    expected = {
        "kl": d,
        "k1": d,
        "abs": np.abs(d),
        "mse": 0.5 * d**2,
        "k2": 0.5 * d**2,
        "low_var_kl": np.clip(np.exp(x) - x - 1, -10, 10),
        "k3": np.clip(np.exp(x) - x - 1, -10, 10),
    }[mode]
    got = kl_penalty_forward(torch.tensor(logprob), torch.tensor(ref), mode)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_kl_penalty_forward_refuses_straight_through_modes():
    from verl.trainer.ppo.core_algos import kl_penalty_forward

    with pytest.raises(ValueError, match=r"'\+' modes only exist in kl_penalty"):
        kl_penalty_forward(torch.zeros(1, 2), torch.zeros(1, 2), "k3+")
    with pytest.raises(ValueError, match="Unknown kl_penalty"):
        kl_penalty_forward(torch.zeros(1, 2), torch.zeros(1, 2), "full")


def test_reward_score_import_lines_of_verl_users():
    from verl.utils.reward_score import default_compute_score, gsm8k, math_reward

    assert default_compute_score is rewards_default
    assert gsm8k.compute_score is rewards_gsm8k.compute_score
    assert gsm8k.extract_solution is rewards_gsm8k.extract_solution
    assert math_reward.compute_score is rewards_math.compute_score
    for name in ("is_equiv", "last_boxed_only_string", "remove_boxed", "strip_string"):
        assert getattr(math_reward, name) is getattr(rewards_math, name)
    # verl's calls, with verl's argument names: GSM8K's "#### <answer>" and MATH's last \boxed{}.
    assert gsm8k.compute_score(solution_str="so #### 72", ground_truth="72", method="strict") == 1.0
    assert gsm8k.compute_score("so #### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.extract_solution("a 3 then 4", method="flexible") == "4"
    assert math_reward.compute_score(r"thus \boxed{\frac{1}{2}}", r"\frac12") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 5", "5")["score"] == 1.0


def test_verl_utils_as_torch_index_is_ours():
    import verl.utils
    from verl.algorithms.advantage_vectorized import as_torch_index

    assert verl.utils.as_torch_index is as_torch_index
    assert as_torch_index(["b", "a", "b"]).tolist() == [1, 0, 1]
    assert not hasattr(verl.utils, "group_mean_std")  # different signature here: not under verl's path


PROBE = """
import json, sys
import verl.utils.reward_score, verl.utils.reward_score.gsm8k, verl.utils.reward_score.math_reward
import verl.trainer.ppo
print(json.dumps(sorted(sys.modules)))
"""


def test_the_shim_packages_import_nothing_heavy():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    modules = set(json.loads(out.stdout))
    assert "verl.utils.reward_score.gsm8k" in modules  # the probe did import them
    assert not {m for m in modules if m.split(".")[0] in {"torch", "ray", "transformers", "pluggy"}}
    assert "verl.trainer.ppo.core_algos" not in modules and "verl.algorithms" not in modules
