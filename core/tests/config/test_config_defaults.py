"""Defaults match verl (anatomy §9.2) except the documented CPU-first deviations; follow-values resolve."""

from __future__ import annotations

import subprocess
import sys
import typing

import attrs
import pytest

from verl.config import RootConfig, get_path, load_config, resolve_config

# Expected values written down from verl's _generated_ppo_trainer.yaml (anatomy §9.2 / §4 / §5), not from the code.
VERL_DEFAULTS = {
    "data.prompt_key": "prompt",
    "data.reward_fn_key": "data_source",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "data.gen_batch_size": None,
    "data.val_batch_size": None,
    "data.seed": None,
    "data.return_raw_chat": True,
    "data.shuffle": True,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "data.train_max_samples": -1,
    "data.val_max_samples": -1,
    "data.apply_chat_template_kwargs": {},
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.trust_remote_code": False,
    "actor_rollout_ref.model.override_config": {},
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": 0.0002,
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": 1.0,
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": 5.0,
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": 0.0002,
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": 0.1,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.loss_scale_factor": None,
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.shuffle": False,
    "actor_rollout_ref.actor.data_loader_seed": 42,
    "actor_rollout_ref.actor.tau_pos": 1.0,
    "actor_rollout_ref.actor.tau_neg": 1.05,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.betas": (0.9, 0.999),
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.clip_grad": 1.0,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.checkpoint.save_contents": ("model", "optimizer", "extra"),
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.do_sample": True,
    "actor_rollout_ref.rollout.calculate_log_probs": True,
    "actor_rollout_ref.rollout.seed": 42,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 0.0,
    "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": 2048,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.cliprange_value": 0.5,
    "critic.optim.lr": 1e-5,
    "reward_model.enable": False,
    "reward_model.reward_manager": "naive",
    "custom_reward_function.path": None,
    "custom_reward_function.name": "compute_score",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.horizon": 10000,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.metric": None,
    "algorithm.filter_groups.max_num_gen_batches": 0,
    # verl/trainer/config/algorithm/rollout_correction.yaml (the YAML's rollout_is: null, not the dataclass's)
    "algorithm.rollout_correction.rollout_is": None,
    "algorithm.rollout_correction.rollout_is_threshold": 2.0,
    "algorithm.rollout_correction.rollout_is_batch_normalize": False,
    "algorithm.rollout_correction.rollout_rs": None,
    "algorithm.rollout_correction.rollout_rs_threshold": None,
    "algorithm.rollout_correction.bypass_mode": False,
    "algorithm.rollout_correction.loss_type": "ppo_clip",
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.log_val_generations": 0,
    "trainer.nnodes": 1,
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.resume_mode": "auto",
    "trainer.val_before_train": True,
    "trainer.critic_warmup": 0,
    "trainer.max_actor_ckpt_to_keep": None,
    "trainer.max_critic_ckpt_to_keep": None,
    "trainer.balance_batch": True,
    "actor_rollout_ref.rollout.free_cache_engine": True,
    "ray_kwargs.ray_init": {},
}

# Documented CPU-first deviations (see the class docstrings).
CPU_FIRST_DEFAULTS = {
    "actor_rollout_ref.model.path": "smollm2-135m-instruct",
    "actor_rollout_ref.actor.strategy": "reference",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.rollout.name": "hf",
    "actor_rollout_ref.rollout.mode": "sync",
    "actor_rollout_ref.rollout.dtype": "auto",  # float32 on cpu, bfloat16 on accelerators (verl: bfloat16)
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,  # verl: 2 (a CPU run has no second device)
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "colocated",
    "data.dataloader_num_workers": 0,
    "trainer.n_gpus_per_node": 1,
    "trainer.logger": ("console",),
    "trainer.device": None,
    "trainer.controller": "local",
}


@pytest.mark.parametrize("key,expected", sorted({**VERL_DEFAULTS, **CPU_FIRST_DEFAULTS}.items()))
def test_default_value(key: str, expected: object) -> None:
    value = get_path(load_config(), key)
    assert value == expected
    assert type(value) is type(expected)


def test_follow_values_resolve_from_their_sources() -> None:
    cfg = load_config(
        overrides=[
            "data.max_prompt_length=256",
            "data.max_response_length=128",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.model.path=/models/m",
            "trainer.project_name=p",
            "trainer.experiment_name=e",
            "trainer.seed=7",
        ]
    )
    arr = cfg.actor_rollout_ref
    assert (arr.rollout.prompt_length, arr.rollout.response_length) == (256, 128)
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 8
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 8
    assert arr.ref.log_prob_use_dynamic_bsz is False
    assert arr.ref.log_prob_max_token_len_per_gpu == 16384
    assert arr.model.tokenizer_path == "/models/m"
    assert cfg.critic.enable is True  # gae
    assert (cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_micro_batch_size_per_gpu, cfg.critic.ppo_epochs) == (
        64,
        8,
        2,
    )
    assert cfg.critic.model.path == "/models/m"
    assert cfg.critic.strategy == "reference"
    assert cfg.critic.loss_agg_mode == "token-mean"
    assert arr.actor.checkpoint.load_contents == ("model", "optimizer", "extra")
    assert cfg.trainer.default_local_dir == "checkpoints/p/e"
    assert cfg.data.seed is None  # verl's sampler default applies, not trainer.seed


def test_explicit_values_beat_follow_values() -> None:
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.rollout.prompt_length=600",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.model.path=/models/critic",
            "trainer.default_local_dir=/ckpt",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.prompt_length == 600
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 2
    assert cfg.critic.model.path == "/models/critic"
    assert cfg.trainer.default_local_dir == "/ckpt"


@pytest.mark.parametrize("estimator,enabled", [("gae", True), ("grpo", False), ("rloo", False)])
def test_critic_enable_null_means_only_for_gae(estimator: str, enabled: bool) -> None:
    cfg = load_config(overrides=[f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=2"])
    assert cfg.critic.enable is enabled


def test_resolve_is_idempotent_and_raw_defaults_keep_nulls() -> None:
    raw = RootConfig()
    assert raw.critic.enable is None and raw.actor_rollout_ref.rollout.prompt_length is None
    once = resolve_config(raw)
    assert resolve_config(once) == once
    assert once == load_config()


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.actor_rollout_ref.rollout.n = 8  # type: ignore[misc]


def _walk(cls: type, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        path = f"{prefix}.{field.name}" if prefix else field.name
        yield path, field
        if attrs.has(hints[field.name]):
            yield from _walk(hints[field.name], path)


def test_every_key_is_documented() -> None:
    undocumented = [path for path, field in _walk(RootConfig) if len(field.metadata.get("doc", "")) < 8]
    assert undocumented == []


def test_importing_verl_config_does_not_import_torch() -> None:
    code = "import sys, verl.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_pickles_and_hashes_for_worker_processes() -> None:
    import pickle

    cfg = load_config(overrides=["+actor_rollout_ref.model.override_config.attention_dropout=0.1"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert hash(cfg) == hash(load_config(overrides=["+actor_rollout_ref.model.override_config.attention_dropout=0.1"]))
