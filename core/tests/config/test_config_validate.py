"""Cross-field validation: K20 batch sizes, K09 temperature, K22 KL routing, choices, ranges, warnings."""

from __future__ import annotations

import logging

import attrs
import pytest

from verl.config import ConfigError, RootConfig, load_config, replace_path, validate_config

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"


def _error(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return info.value


def _warnings(overrides: list[str]) -> list[str]:
    seen: list[str] = []
    load_config(overrides=overrides, on_warning=seen.append)
    return seen


# ---------------------------------------------------------------- K20
def test_k20_actor_mini_per_gpu_smaller_than_micro() -> None:
    error = _error(
        ["data.train_batch_size=8", f"{ACTOR}.ppo_mini_batch_size=2", f"{ACTOR}.ppo_micro_batch_size_per_gpu=4"]
    )
    assert error.key == f"{ACTOR}.ppo_micro_batch_size_per_gpu"
    assert "mini-batch per GPU (2) must be >= and a multiple of micro-batch per GPU (4)" in str(error)


def test_k20_mini_per_gpu_is_normalised_by_n_and_world_size() -> None:
    # 1 prompt x n=4 sequences over 2 workers = 2 sequences per GPU, micro-batch 4.
    error = _error(
        [
            "trainer.controller=ray",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=2",
            f"{ROLLOUT}.n=4",
            f"{ACTOR}.ppo_mini_batch_size=1",
            f"{ACTOR}.ppo_micro_batch_size_per_gpu=4",
            "algorithm.adv_estimator=grpo",
        ]
    )
    assert "mini-batch per GPU (2) must be >= and a multiple of micro-batch per GPU (4)" in str(error)


def test_k20_critic_is_checked_on_its_own_values() -> None:
    error = _error(
        [
            "data.train_batch_size=8",
            f"{ACTOR}.ppo_mini_batch_size=2",
            f"{ACTOR}.ppo_micro_batch_size_per_gpu=1",
            "critic.ppo_micro_batch_size_per_gpu=4",
        ]
    )
    assert [i.key for i in error.issues] == ["critic.ppo_micro_batch_size_per_gpu"]
    assert "mini-batch per GPU (2) must be >= and a multiple of micro-batch per GPU (4)" in str(error)


def test_k20_not_a_multiple() -> None:
    error = _error(
        ["data.train_batch_size=12", f"{ACTOR}.ppo_mini_batch_size=6", f"{ACTOR}.ppo_micro_batch_size_per_gpu=4"]
    )
    assert "mini-batch per GPU (6) must be >= and a multiple of micro-batch per GPU (4)" in str(error)


def test_a_critic_following_the_actor_does_not_repeat_the_actor_error() -> None:
    error = _error(["data.train_batch_size=8", f"{ACTOR}.ppo_mini_batch_size=2"])
    assert [i.key for i in error.issues] == [f"{ACTOR}.ppo_micro_batch_size_per_gpu"]


def test_consistent_batch_sizes_load() -> None:
    cfg = load_config(
        overrides=[
            "trainer.controller=ray",
            f"{ACTOR}.strategy=fsdp",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=16",
            f"{ROLLOUT}.n=4",
            f"{ACTOR}.ppo_mini_batch_size=4",
            f"{ACTOR}.ppo_micro_batch_size_per_gpu=2",  # 4*4/2 = 8 per GPU, 4 micro-batches
            "algorithm.adv_estimator=grpo",
        ]
    )
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 2


def test_mini_batch_larger_than_train_batch() -> None:
    error = _error(["data.train_batch_size=8", f"{ACTOR}.ppo_mini_batch_size=16"])
    assert f"{ACTOR}.ppo_mini_batch_size (16) must be <= data.train_batch_size (8)" in str(error)


def test_train_batch_must_split_into_whole_mini_batches() -> None:
    error = _error(
        ["data.train_batch_size=10", f"{ACTOR}.ppo_mini_batch_size=4", f"{ACTOR}.ppo_micro_batch_size_per_gpu=1"]
    )
    assert f"data.train_batch_size (10) must be a multiple of {ACTOR}.ppo_mini_batch_size (4)" in str(error)


def test_train_batch_times_n_divisible_by_world_size() -> None:
    error = _error(
        [
            "trainer.controller=ray",
            f"{ACTOR}.strategy=fsdp",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=3",
            f"{ACTOR}.ppo_mini_batch_size=3",
        ]
    )
    assert error.issues[0].key == "data.train_batch_size"
    assert "= 3 sequences must be divisible by the world size trainer.nnodes x trainer.n_gpus_per_node = 2" in str(
        error
    )


def test_mini_batch_times_n_divisible_by_world_size() -> None:
    error = _error(
        [
            "trainer.controller=ray",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=2",
            "data.train_batch_size=8",
            f"{ACTOR}.ppo_mini_batch_size=2",
        ]
    )
    assert (
        f"{ACTOR}.ppo_mini_batch_size (2) x {ROLLOUT}.n (1) = 2 sequences must be divisible by the world size"
        in str(error)
    )


def test_micro_batch_required_unless_dynamic() -> None:
    error = _error([f"{ACTOR}.ppo_micro_batch_size_per_gpu=null"])
    assert error.key == f"{ACTOR}.ppo_micro_batch_size_per_gpu" and "must be set" in str(error)
    cfg = load_config(overrides=[f"{ACTOR}.ppo_micro_batch_size_per_gpu=null", f"{ACTOR}.use_dynamic_bsz=true"])
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is True


def test_dynamic_token_budget_must_hold_the_longest_sequence() -> None:
    error = _error([f"{ACTOR}.use_dynamic_bsz=true", f"{ACTOR}.ppo_max_token_len_per_gpu=1000"])
    keys = {i.key for i in error.issues}
    # 512 + 512 = 1024 tokens > 1000: actor, and the rollout/ref log-prob passes that follow it.
    assert keys == {
        f"{ACTOR}.ppo_max_token_len_per_gpu",
        f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    }
    assert "= 1024; got 1000" in str(error)


# ---------------------------------------------------------------- K09
def test_k09_temperature_zero_rejected_when_sampling() -> None:
    error = _error([f"{ROLLOUT}.temperature=0"])
    assert error.key == f"{ROLLOUT}.temperature" and "do_sample=false" in str(error)


def test_k09_temperature_zero_allowed_for_greedy() -> None:
    cfg = load_config(overrides=[f"{ROLLOUT}.temperature=0", f"{ROLLOUT}.do_sample=false"])
    assert cfg.actor_rollout_ref.rollout.temperature == 0.0


def test_negative_temperature_rejected_even_for_greedy() -> None:
    assert _error([f"{ROLLOUT}.temperature=-1", f"{ROLLOUT}.do_sample=false"]).key == f"{ROLLOUT}.temperature"


def test_val_kwargs_sampling_needs_temperature() -> None:
    error = _error([f"{ROLLOUT}.val_kwargs.do_sample=true"])
    assert error.key == f"{ROLLOUT}.val_kwargs.temperature"
    load_config(overrides=[f"{ROLLOUT}.val_kwargs.do_sample=true", f"{ROLLOUT}.val_kwargs.temperature=0.6"])


@pytest.mark.parametrize(
    "override,key",
    [
        (f"{ROLLOUT}.top_p=0", f"{ROLLOUT}.top_p"),
        (f"{ROLLOUT}.top_p=1.5", f"{ROLLOUT}.top_p"),
        (f"{ROLLOUT}.top_k=-2", f"{ROLLOUT}.top_k"),
        (f"{ROLLOUT}.val_kwargs.top_p=0", f"{ROLLOUT}.val_kwargs.top_p"),
        (f"{ROLLOUT}.prompt_length=100", f"{ROLLOUT}.prompt_length"),
        (f"{ROLLOUT}.response_length=1000", f"{ROLLOUT}.response_length"),
        (f"{ROLLOUT}.n=0", f"{ROLLOUT}.n"),
    ],
)
def test_sampling_ranges(override: str, key: str) -> None:
    assert key in {i.key for i in _error([override]).issues}


# ---------------------------------------------------------------- K22
def test_k22_no_kl_means_no_kl() -> None:
    cfg = load_config(overrides=[f"{ACTOR}.use_kl_loss=false", "algorithm.use_kl_in_reward=false"])
    assert cfg.algorithm.use_kl_in_reward is False and cfg.actor_rollout_ref.actor.use_kl_loss is False
    # KL in the reward is never switched on because the KL loss is off.
    assert load_config().algorithm.use_kl_in_reward is False


def test_k22_kl_in_reward_alone_is_silent() -> None:
    assert not [w for w in _warnings(["algorithm.use_kl_in_reward=true"]) if "KL" in w]


def test_k22_both_kl_terms_are_warned_as_additive() -> None:
    warnings = _warnings(["algorithm.use_kl_in_reward=true", f"{ACTOR}.use_kl_loss=true"])
    assert len(warnings) == 1
    assert "algorithm.use_kl_in_reward" in warnings[0] and f"{ACTOR}.use_kl_loss" in warnings[0]
    assert "twice" in warnings[0]


def test_warnings_are_logged_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="verl.config"):
        load_config(overrides=["algorithm.use_kl_in_reward=true", f"{ACTOR}.use_kl_loss=true"])
    assert any("twice" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- algorithm
def test_gae_needs_a_critic() -> None:
    error = _error(["critic.enable=false"])
    assert error.key == "critic.enable" and "gae" in str(error)


def test_critic_with_a_critic_free_estimator_is_warned() -> None:
    warnings = _warnings(["algorithm.adv_estimator=grpo", f"{ROLLOUT}.n=2", "critic.enable=true"])
    assert any(w.startswith("critic.enable:") for w in warnings)


def test_group_estimator_with_one_response() -> None:
    assert any(w.startswith(f"{ROLLOUT}.n:") for w in _warnings(["algorithm.adv_estimator=grpo"]))
    assert _error(["algorithm.adv_estimator=grpo_passk"]).key == f"{ROLLOUT}.n"


@pytest.mark.parametrize(
    "mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]
)
def test_the_five_loss_agg_modes_load(mode: str) -> None:
    assert load_config(overrides=[f"{ACTOR}.loss_agg_mode={mode}"]).critic.loss_agg_mode == mode


@pytest.mark.parametrize(
    "override,key,needle",
    [
        (f"{ACTOR}.loss_agg_mode=mean", f"{ACTOR}.loss_agg_mode", "'seq-mean-token-sum-norm'"),
        ("critic.loss_agg_mode=sum", "critic.loss_agg_mode", "'token-sum'"),
        ("data.truncation=cut", "data.truncation", "'middle'"),
        ("trainer.resume_mode=latest", "trainer.resume_mode", "'resume_path'"),
        ("algorithm.kl_penalty=full", "algorithm.kl_penalty", "low_var_kl"),
        (f"{ACTOR}.kl_loss_type=k4", f"{ACTOR}.kl_loss_type", "k3+"),
        ("algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type", "'adaptive'"),
        (f"{ACTOR}.optim.lr_scheduler_type=linear", f"{ACTOR}.optim.lr_scheduler_type", "'cosine'"),
        ("reward_model.on_error=ignore", "reward_model.on_error", "'zero'"),
    ],
)
def test_invalid_choices_list_the_valid_ones(override: str, key: str, needle: str) -> None:
    error = _error([override])
    assert error.key == key and needle in str(error)


def test_straight_through_kl_names_are_accepted() -> None:
    cfg = load_config(overrides=[f"{ACTOR}.kl_loss_type=low_var_kl+", "algorithm.kl_penalty=k1"])
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl+"


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"], "algorithm.kl_ctrl.horizon"),
        (["algorithm.kl_ctrl.kl_coef=-0.1"], "algorithm.kl_ctrl.kl_coef"),
        ([f"{ACTOR}.kl_loss_coef=-1"], f"{ACTOR}.kl_loss_coef"),
        (["algorithm.gamma=1.5"], "algorithm.gamma"),
        ([f"{ACTOR}.clip_ratio_c=1.0"], f"{ACTOR}.clip_ratio_c"),
        ([f"{ACTOR}.optim.betas=[0.9, 1.0]"], f"{ACTOR}.optim.betas[1]"),
        ([f"{ACTOR}.optim.clip_grad=0"], f"{ACTOR}.optim.clip_grad"),
        ([f"{ACTOR}.optim.lr_warmup_steps_ratio=2"], f"{ACTOR}.optim.lr_warmup_steps_ratio"),
        (["critic.optim.lr=-1"], "critic.optim.lr"),
        ([f"{ACTOR}.checkpoint.save_contents=[]"], f"{ACTOR}.checkpoint.save_contents"),
        (["trainer.resume_mode=resume_path"], "trainer.resume_from_path"),
        (["trainer.controller=local", "trainer.n_gpus_per_node=2"], "trainer.controller"),
        (["reward_model.enable=true"], "reward_model.model.path"),
        (["reward_model.timeout_s=0"], "reward_model.timeout_s"),
        (["data.train_max_samples=0"], "data.train_max_samples"),
        (["trainer.total_epochs=0"], "trainer.total_epochs"),
    ],
)
def test_range_rules(overrides: list[str], key: str) -> None:
    assert key in {i.key for i in _error(overrides).issues}


def test_resume_path_with_a_path_loads() -> None:
    cfg = load_config(overrides=["trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/global_step_5"])
    assert cfg.trainer.resume_from_path == "/ckpt/global_step_5"


def test_other_warnings() -> None:
    warnings = _warnings(
        ["trainer.test_freq=5", "trainer.resume_from_path=/x", f"{ROLLOUT}.do_sample=false", f"{ROLLOUT}.n=2"]
    )
    keys = sorted(w.split(":")[0] for w in warnings)
    assert keys == [f"{ROLLOUT}.n", "trainer.resume_from_path", "trainer.test_freq"]


# ---------------------------------------------------------------- configs built in Python
def test_validate_config_checks_types_of_programmatic_configs() -> None:
    cfg = replace_path(RootConfig(), f"{ROLLOUT}.n", "2")
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert info.value.key == f"{ROLLOUT}.n" and "expected int, got '2' (str)" in str(info.value)


def test_validate_config_checks_choices_of_programmatic_configs() -> None:
    cfg = attrs.evolve(RootConfig(), data=attrs.evolve(RootConfig().data, truncation="sideways"))
    with pytest.raises(ConfigError, match="data.truncation"):
        validate_config(cfg)


def test_validate_config_returns_warnings_of_unresolved_configs() -> None:
    cfg = replace_path(RootConfig(), "algorithm.use_kl_in_reward", True)
    cfg = replace_path(cfg, f"{ACTOR}.use_kl_loss", True)
    assert len(validate_config(cfg)) == 1


def test_single_process_engine_refused_on_several_workers() -> None:
    # The reference engine has no data_parallel capability: two workers would train two diverging copies.
    error = _error(["trainer.controller=ray", "trainer.n_gpus_per_node=2", f"{ACTOR}.strategy=reference"])
    assert error.issues[0].key == f"{ACTOR}.strategy"
    assert "training engine 'reference' runs in a single process and cannot train on 2 workers" in str(error)
    assert f"{ACTOR}.strategy=fsdp" in str(error)
