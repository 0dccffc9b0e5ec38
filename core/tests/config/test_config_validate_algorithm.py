"""Config checks of the estimator/loss keys added for verl parity (gdpo, OTB, dro, bypass_mode)."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config


@pytest.fixture(autouse=True)
def real_algorithm_registry(fake_backends, monkeypatch):
    """The new names are checked against verl.algorithms itself (conftest's stand-in lists only a few)."""
    import verl.algorithms
    from verl.config import backend_options

    monkeypatch.setattr(backend_options, "default_algorithm_registry", lambda: verl.algorithms)


BASE = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]
PL = "actor_rollout_ref.actor.policy_loss"


def load(*overrides: str):
    warnings: list[str] = []
    cfg = load_config(None, [*BASE, *overrides], on_warning=warnings.append)
    return cfg, warnings


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_token_baseline_estimators_are_refused_with_the_reason(name):
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator.*sum_pi_squared.*calculate_sum_pi_squared"):
        load(f"algorithm.adv_estimator={name}")


def test_gdpo_needs_its_reward_keys_and_one_weight_per_key():
    with pytest.raises(ConfigError, match=r"algorithm.gdpo_reward_keys.*compute_score"):
        load("algorithm.adv_estimator=gdpo")
    cfg, _ = load("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[fmt,acc]")
    assert cfg.algorithm.gdpo_reward_keys == ("fmt", "acc") and cfg.algorithm.gdpo_reward_weights is None
    cfg, _ = load(
        "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[fmt,acc]", "algorithm.gdpo_reward_weights=[1,0.5]"
    )
    assert cfg.algorithm.gdpo_reward_weights == (1.0, 0.5)
    with pytest.raises(ConfigError, match=r"gdpo_reward_weights.*3 entries for 2"):
        load(
            "algorithm.adv_estimator=gdpo",
            "algorithm.gdpo_reward_keys=[fmt,acc]",
            "algorithm.gdpo_reward_weights=[1,1,1]",
        )


def test_gdpo_keys_with_another_estimator_warn():
    _, warnings = load("algorithm.gdpo_reward_keys=[fmt]")
    assert any("only by adv_estimator=gdpo" in w for w in warnings)


def test_dro_needs_a_positive_beta():
    with pytest.raises(ConfigError, match=rf"{PL}.dro_beta.*> 0"):
        load(f"{PL}.loss_mode=dro")
    cfg, _ = load(f"{PL}.loss_mode=dro", f"{PL}.dro_beta=0.1")
    assert cfg.actor_rollout_ref.actor.policy_loss.dro_beta == 0.1


def test_rollout_correction_keys():
    cfg, _ = load(f"{PL}.loss_mode=bypass_mode", f"{PL}.rollout_correction.rollout_is_threshold=0.5_2.0")
    corr = cfg.actor_rollout_ref.actor.policy_loss.rollout_correction
    assert (corr.loss_type, corr.rollout_is, corr.rollout_is_threshold) == ("ppo_clip", "sequence", "0.5_2.0")
    with pytest.raises(ConfigError, match=r"rollout_is_threshold.*neither a number"):
        load(f"{PL}.rollout_correction.rollout_is_threshold=big")
    with pytest.raises(ConfigError, match=rf"{PL}.rollout_correction.rollout_rs_threshold.*needs rollout_rs_threshold"):
        load(f"{PL}.rollout_correction.rollout_rs=token_k1")
    cfg, _ = load(f"{PL}.rollout_correction.rollout_rs=token_k1", f"{PL}.rollout_correction.rollout_rs_threshold=2")
    assert cfg.actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_rs == "token_k1"
    with pytest.raises(ConfigError, match=r"loss_type"):
        load(f"{PL}.rollout_correction.loss_type=ppo")


def test_bypass_loss_without_bypass_mode_warns():
    _, warnings = load(f"{PL}.loss_mode=bypass_mode")
    assert any("algorithm.rollout_correction.bypass_mode" in w for w in warnings)
    _, warnings = load(
        f"{PL}.loss_mode=bypass_mode",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    )
    assert not any("treats old_log_prob" in w for w in warnings)


BYPASS = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=true"]


@pytest.mark.parametrize("mode", ["gspo", "dppo_tv", "cispo"])
def test_bypass_mode_with_another_loss_is_refused(mode):
    # verl's apply_bypass_mode would swap the loss for bypass_mode; running it on rollout log-probs is neither.
    with pytest.raises(ConfigError, match=rf"{PL}.loss_mode='{mode}'.*loss_mode=bypass_mode.*bypass_mode=false"):
        load(f"{PL}.loss_mode={mode}", *BYPASS)
    cfg, _ = load(f"{PL}.loss_mode={mode}")  # without bypass_mode the loss runs on recomputed log-probs
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == mode


def test_bypass_mode_reads_the_algorithm_section_and_refuses_the_dropped_policy_loss_one():
    for mode in ("vanilla", "bypass_mode"):
        cfg, _ = load(f"{PL}.loss_mode={mode}", *BYPASS)
        assert cfg.algorithm.rollout_correction.bypass_mode
    # verl's apply_bypass_mode swaps vanilla for bypass_mode with algorithm.rollout_correction's loss_type.
    cfg, _ = load(f"{PL}.loss_mode=vanilla", "algorithm.rollout_correction.loss_type=reinforce", *BYPASS)
    assert cfg.algorithm.rollout_correction.loss_type == "reinforce"
    # ... and drops policy_loss.rollout_correction: a value set there is refused, naming where to set it.
    with pytest.raises(
        ConfigError, match=rf"{PL}.rollout_correction.loss_type='reinforce'.*set algorithm.rollout_correction.loss_type"
    ):
        load(f"{PL}.loss_mode=bypass_mode", f"{PL}.rollout_correction.loss_type=reinforce", *BYPASS)
    with pytest.raises(ConfigError, match=rf"{PL}.rollout_correction.rollout_is=None"):
        load(f"{PL}.rollout_correction.rollout_is=null", *BYPASS)


@pytest.mark.parametrize("name", ["grpo_vectorized", "rloo_vectorized"])
def test_vectorized_estimators_load(name):
    cfg, _ = load(f"algorithm.adv_estimator={name}")
    assert cfg.algorithm.adv_estimator == name


@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl"])
def test_dppo_losses_load(mode):
    cfg, _ = load(f"{PL}.loss_mode={mode}")
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == mode


@pytest.mark.parametrize(("text", "value"), [("3", 3.0), ("0.5_2.0", "0.5_2.0"), ("'2.5'", "2.5")])
def test_threshold_is_a_number_or_a_string(text, value):
    cfg, _ = load(f"{PL}.rollout_correction.rollout_is_threshold={text}")
    assert cfg.actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_threshold == value


@pytest.mark.parametrize("text", ["true", "[1, 2]", "{a: 1}", "null"])
def test_threshold_of_another_type_is_refused_naming_the_key(text):
    with pytest.raises(ConfigError, match=rf"{PL}.rollout_correction.rollout_is_threshold.*float or str"):
        load(f"{PL}.rollout_correction.rollout_is_threshold={text}")


AC = "algorithm.rollout_correction"


@pytest.mark.parametrize("key", ["rollout_is=token", "rollout_rs=token_k1"])
def test_decoupled_correction_needs_the_rollout_log_probs(key):
    extra = [f"{AC}.rollout_rs_threshold=2"] if "rollout_rs" in key else []
    name = key.split("=")[0]
    with pytest.raises(
        ConfigError,
        match=rf"{AC}.{name}=.*needs the rollout's log-probs; set actor_rollout_ref.rollout.calculate_log_probs",
    ):
        load(f"{AC}.{key}", *extra, "actor_rollout_ref.rollout.calculate_log_probs=false")
    cfg, warnings = load(f"{AC}.{key}", *extra)
    assert getattr(cfg.algorithm.rollout_correction, name) == key.split("=")[1] and not warnings


@pytest.mark.parametrize(
    ("overrides", "key", "match"),
    [
        ([f"{AC}.rollout_is=token", f"{AC}.rollout_is_threshold=null"], "rollout_is_threshold", "computes no weights"),
        ([f"{AC}.rollout_is_threshold=0_2"], "rollout_is_threshold", "must be > 0"),
        ([f"{AC}.rollout_rs=seq_mean_k9", f"{AC}.rollout_rs_threshold=2"], "rollout_rs", "'seq_mean_k9' is unknown"),
        ([f"{AC}.rollout_rs=token_k2"], "rollout_rs_threshold", "needs rollout_rs_threshold"),
        ([f"{AC}.rollout_rs=token_k2", f"{AC}.rollout_rs_threshold=0.5_2"], "rollout_rs_threshold", "single upper"),
        (
            [f"{AC}.rollout_rs=token_k1,token_k2", f"{AC}.rollout_rs_threshold='1,2,3'"],
            "rollout_rs_threshold",
            "3 entries",
        ),
        ([f"{AC}.rollout_is=geo"], "rollout_is", "expected one of 'token', 'sequence'"),
        ([f"{AC}.loss_type=pg"], "loss_type", "expected one of 'ppo_clip', 'reinforce'"),
    ],
)
def test_algorithm_rollout_correction_errors_name_the_key(overrides, key, match):
    with pytest.raises(ConfigError, match=rf"{AC}.{key}.*{match}"):
        load(*overrides)


def test_verls_chained_modes_and_icepop_band_load():
    cfg, warnings = load(
        f"{AC}.rollout_is=sequence",
        f"{AC}.rollout_is_threshold=0.5_5.0",
        f"{AC}.rollout_is_batch_normalize=true",
        f"{AC}.rollout_rs=token_k1,seq_max_k3",
        f"{AC}.rollout_rs_threshold='0.999_1.001,0.01'",
    )
    corr = cfg.algorithm.rollout_correction
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.rollout_is_batch_normalize) == (
        "sequence",
        "0.5_5.0",
        True,
    )
    assert (corr.rollout_rs, corr.rollout_rs_threshold) == ("token_k1,seq_max_k3", "0.999_1.001,0.01")
    assert not warnings
    # verl's scripts switch IS off with both keys null
    cfg, _ = load(f"{AC}.rollout_is=null", f"{AC}.rollout_is_threshold=null")
    assert cfg.algorithm.rollout_correction.rollout_is_threshold is None


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"{AC}.rollout_rs_threshold=2", "rollout_rs_threshold"),
        (f"{AC}.rollout_is_batch_normalize=true", "rollout_is_batch_normalize"),
        (f"{AC}.loss_type=reinforce", "loss_type"),
    ],
)
def test_keys_verl_reads_only_with_another_key_warn(override, key):
    _, warnings = load(override)
    assert any(w.startswith(f"{AC}.{key}") for w in warnings), warnings
