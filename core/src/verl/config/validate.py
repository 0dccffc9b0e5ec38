"""Cross-field validation, run by :func:`verl.config.load_config` before anything heavy starts.

Errors (all collected, then one :class:`ConfigError`):

1. types and choices of every key (also for configs built in Python): Literal keys such as
   ``data.truncation``, ``trainer.resume_mode``, ``actor.loss_agg_mode`` (5 modes);
2. counts and lengths >= 1 (batch sizes, lengths, ``rollout.n``, epochs, world size, ...);
3. batch sizes (:mod:`verl.config.validate_batch`): mini <= train batch, train batch a
   multiple of mini, ``train_batch_size*n`` and ``ppo_mini_batch_size*n`` divisible by the
   world size, mini-batch per GPU >= and a multiple of micro-batch per GPU (K20) for actor
   and critic, micro-batch sizes set unless dynamic batching, token budgets >= the longest
   sequence with dynamic batching;
4. sampling: temperature < 0, or 0 with ``do_sample`` (K09), for rollout and ``val_kwargs``;
   ``top_p`` in (0, 1]; ``top_k`` >= -1; rollout lengths within the data lengths;
5. algorithm: ``gae`` needs a critic (``critic.enable: false`` is an error); ``grpo_passk``
   needs ``rollout.n`` >= 2; KL estimator names; KL coefficients >= 0; adaptive KL needs
   ``horizon``/``target_kl`` > 0; ``gamma``/``lam`` in [0, 1]; ``clip_ratio_c`` > 1; DAPO's
   ``filter_groups`` and ``data.gen_batch_size`` (:mod:`verl.config.validate_filter_groups`); one-step off-policy
   ``async_training.*`` (:mod:`verl.config.validate_async`);
6. optimizer ranges (betas in [0, 1), clip_grad > 0, ratios in [0, 1]);
7. trainer: ``resume_path`` needs ``resume_from_path``; ``controller: local`` needs world size 1;
   reward model needs a path; positive timeouts and worker counts; rollout placement, mode and
   tensor-parallel size (:mod:`verl.config.validate_rollout`); LoRA keys (:mod:`verl.config.validate_lora`);
8. values of verl keys that are not built (reward managers, optim.total_training_steps, checkpoint contents),
   refused with the alternative (:mod:`verl.config.validate_support`); verl's engine family, old names and
   switches (``model_engine``, ``actor.grad_clip``, ``optim.min_lr``, ...: :mod:`verl.config.validate_compat`);
9. paths: ``data.train_files`` / ``val_files`` given as an empty list or holding a blank entry, and a blank
   ``actor_rollout_ref.model.path`` (found by the config fuzz tests: they used to pass and fail later).

Warnings (returned, and logged by load_config): KL in reward *and* KL loss both on (K22c:
deliberately additive, KL penalised twice); a critic enabled for a non-GAE estimator; group
estimators with ``rollout.n`` < 2; greedy decoding with ``n`` > 1; ``test_freq`` without
``val_files``; ``resume_from_path`` ignored; critic warmup without a critic.
"""

from __future__ import annotations

from verl.config.converter import structure
from verl.config.dump import to_dict
from verl.config.errors import IssueCollector
from verl.config.resolve import resolve_config
from verl.config.schema import OptimConfig, RootConfig
from verl.config.validate_agents import check_agents
from verl.config.validate_algorithm import check_algorithm_keys
from verl.config.validate_async import check_async_training
from verl.config.validate_batch import ARR, check_batch_sizes, world_size
from verl.config.validate_compat import check_compat
from verl.config.validate_filter_groups import check_filter_groups
from verl.config.validate_lora import check_lora
from verl.config.validate_rollout import check_rollout
from verl.config.validate_support import check_support

# verl/trainer/ppo/core_algos.py:kl_penalty; "full" is NotImplementedError there, so it is rejected.
_KL_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_ESTIMATORS = frozenset(_KL_BASE + tuple(f"{name}+" for name in _KL_BASE))
# Estimators whose baseline is the prompt's group of rollout.n responses.
GROUP_ESTIMATORS = frozenset(
    {
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "rloo",
        "rloo_vectorized",
        "reinforce_plus_plus_baseline",
        "opo",
        "gpg",
        "gdpo",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }
)


def validate_config(cfg: RootConfig) -> list[str]:
    """Check ``cfg`` (resolving null follow-values first); return warning messages.

    Raises:
        ConfigError: listing every violated rule, each naming its dotted key(s), the values
            and the fix.
    """
    structure(to_dict(cfg), RootConfig)  # types and choices, for configs built in Python
    cfg = resolve_config(cfg)
    report = IssueCollector()
    _check_counts(cfg, report)
    check_batch_sizes(cfg, report)
    _check_sampling(cfg, report)
    _check_algorithm(cfg, report)
    check_algorithm_keys(cfg, report)
    check_filter_groups(cfg, report)
    check_async_training(cfg, report)
    _check_optim(report, f"{ARR}.actor.optim", cfg.actor_rollout_ref.actor.optim)
    if cfg.critic.enable:
        _check_optim(report, "critic.optim", cfg.critic.optim)
    _check_trainer(cfg, report)
    check_rollout(cfg, report)
    check_lora(cfg, report)
    check_agents(cfg, report)
    check_support(cfg, report)
    check_compat(cfg, report)
    _check_reward(cfg, report)
    _check_paths(cfg, report)
    report.raise_if_errors()
    return report.warnings


def _at_least(report: IssueCollector, key: str, value: int | float | None, minimum: int | float, unit: str) -> None:
    if value is not None and value < minimum:
        report.error(key, f"must be >= {minimum} ({unit}), got {value}")


def _check_counts(cfg: RootConfig, report: IssueCollector) -> None:
    data, rollout, actor, trainer = cfg.data, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor, cfg.trainer
    for key, value, unit in (
        ("data.train_batch_size", data.train_batch_size, "prompts per step"),
        ("data.val_batch_size", data.val_batch_size, "prompts per validation batch"),
        ("data.max_prompt_length", data.max_prompt_length, "tokens"),
        ("data.max_response_length", data.max_response_length, "tokens"),
        (f"{ARR}.rollout.n", rollout.n, "responses per prompt"),
        (f"{ARR}.rollout.val_kwargs.n", rollout.val_kwargs.n, "responses per prompt"),
        (f"{ARR}.rollout.prompt_length", rollout.prompt_length, "tokens"),
        (f"{ARR}.rollout.response_length", rollout.response_length, "tokens"),
        (
            f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes",
            rollout.checkpoint_engine.update_weights_bucket_megabytes,
            "MiB",
        ),
        (f"{ARR}.actor.ppo_epochs", actor.ppo_epochs, "passes per batch"),
        (f"{ARR}.actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu, "tokens"),
        ("trainer.nnodes", trainer.nnodes, "nodes"),
        ("trainer.n_gpus_per_node", trainer.n_gpus_per_node, "workers per node"),
        ("trainer.total_epochs", trainer.total_epochs, "epochs"),
        ("trainer.total_training_steps", trainer.total_training_steps, "steps"),
        ("trainer.max_actor_ckpt_to_keep", trainer.max_actor_ckpt_to_keep, "checkpoints"),
        ("trainer.max_critic_ckpt_to_keep", trainer.max_critic_ckpt_to_keep, "checkpoints"),
        ("reward_model.num_workers", cfg.reward_model.num_workers, "workers"),
    ):
        _at_least(report, key, value, 1, unit)
    if cfg.critic.enable:
        _at_least(report, "critic.ppo_epochs", cfg.critic.ppo_epochs, 1, "passes per batch")
    for key, value, unit in (
        ("data.dataloader_num_workers", data.dataloader_num_workers, "worker processes"),
        ("trainer.log_val_generations", trainer.log_val_generations, "samples"),
        ("trainer.critic_warmup", trainer.critic_warmup, "steps"),
    ):
        _at_least(report, key, value, 0, unit)
    for key, value in (
        ("data.train_max_samples", data.train_max_samples),
        ("data.val_max_samples", data.val_max_samples),
    ):
        if value == 0 or value < -1:
            report.error(key, f"must be -1 (all rows) or >= 1, got {value}")


def _check_sampling(cfg: RootConfig, report: IssueCollector) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    for prefix, params in ((f"{ARR}.rollout", rollout), (f"{ARR}.rollout.val_kwargs", rollout.val_kwargs)):
        if params.temperature < 0:
            report.error(f"{prefix}.temperature", f"must be >= 0, got {params.temperature}")
        elif params.do_sample and params.temperature == 0:
            report.error(
                f"{prefix}.temperature",
                f"temperature 0 with {prefix}.do_sample=true: sampling (and the log-prob recompute, which "
                "divides logits by the temperature) needs temperature > 0; for greedy decoding set "
                f"{prefix}.do_sample=false",
            )
        if not 0 < params.top_p <= 1:
            report.error(f"{prefix}.top_p", f"must be in (0, 1], got {params.top_p}")
        if params.top_k < -1:
            report.error(f"{prefix}.top_k", f"must be -1 (off), 0 (off) or a positive count, got {params.top_k}")
        if not params.do_sample and params.n > 1:
            report.warn(f"{prefix}.n", f"n={params.n} with do_sample=false gives {params.n} identical greedy responses")
    if rollout.prompt_length is not None and rollout.prompt_length < cfg.data.max_prompt_length:
        report.error(
            f"{ARR}.rollout.prompt_length",
            f"({rollout.prompt_length}) must be >= data.max_prompt_length ({cfg.data.max_prompt_length}): "
            "prompts are padded to data.max_prompt_length",
        )
    if rollout.response_length is not None and rollout.response_length > cfg.data.max_response_length:
        report.error(
            f"{ARR}.rollout.response_length",
            f"({rollout.response_length}) must be <= data.max_response_length ({cfg.data.max_response_length}): "
            "responses are padded to data.max_response_length",
        )


def _check_algorithm(cfg: RootConfig, report: IssueCollector) -> None:
    algo, actor, n = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n
    if algo.adv_estimator == "gae" and cfg.critic.enable is False:
        report.error(
            "critic.enable",
            "algorithm.adv_estimator=gae needs a critic; set critic.enable=true (or null), "
            "or choose a critic-free estimator such as grpo or rloo",
        )
    elif cfg.critic.enable and algo.adv_estimator != "gae":
        report.warn(
            "critic.enable",
            f"a critic is trained but algorithm.adv_estimator={algo.adv_estimator} does not use its values",
        )
    if algo.adv_estimator in GROUP_ESTIMATORS and n < 2:
        message = f"{algo.adv_estimator} compares the {ARR}.rollout.n responses of a prompt; n={n} gives no group"
        if algo.adv_estimator == "grpo_passk":
            report.error(f"{ARR}.rollout.n", message + " (grpo_passk needs n >= 2)")
        else:
            report.warn(f"{ARR}.rollout.n", message)
    if algo.rollout_correction.bypass_mode and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        report.error(
            "algorithm.rollout_correction.bypass_mode",
            f"uses the rollout's log-probs as the old policy's; set {ARR}.rollout.calculate_log_probs=true "
            "(or turn bypass_mode off)",
        )
    if algo.use_kl_in_reward and actor.use_kl_loss:
        report.warn(
            "algorithm.use_kl_in_reward",
            f"KL in the reward and {ARR}.actor.use_kl_loss are both on; "
            "they add up (the KL to the reference is penalised twice)",
        )
    for key, name in (("algorithm.kl_penalty", algo.kl_penalty), (f"{ARR}.actor.kl_loss_type", actor.kl_loss_type)):
        if name not in KL_ESTIMATORS:
            report.error(key, f"unknown KL estimator {name!r}; choose one of {', '.join(sorted(KL_ESTIMATORS))}")
    for key, value in (
        ("algorithm.kl_ctrl.kl_coef", algo.kl_ctrl.kl_coef),
        (f"{ARR}.actor.kl_loss_coef", actor.kl_loss_coef),
    ):
        if value < 0:
            report.error(key, f"must be >= 0 (the KL term is a penalty), got {value}")
    if algo.kl_ctrl.type == "adaptive":
        for key, value in (
            ("algorithm.kl_ctrl.horizon", algo.kl_ctrl.horizon),
            ("algorithm.kl_ctrl.target_kl", algo.kl_ctrl.target_kl),
        ):
            if value <= 0:
                report.error(key, f"must be > 0 with algorithm.kl_ctrl.type=adaptive, got {value}")
    for key, value in (("algorithm.gamma", algo.gamma), ("algorithm.lam", algo.lam)):
        if not 0 <= value <= 1:
            report.error(key, f"must be in [0, 1], got {value}")
    for key, value in (
        (f"{ARR}.actor.clip_ratio", actor.clip_ratio),
        (f"{ARR}.actor.clip_ratio_low", actor.clip_ratio_low),
        (f"{ARR}.actor.clip_ratio_high", actor.clip_ratio_high),
    ):
        if value < 0:
            report.error(key, f"must be >= 0, got {value}")
    if actor.clip_ratio_c <= 1:
        report.error(f"{ARR}.actor.clip_ratio_c", f"dual-clip constant must be > 1, got {actor.clip_ratio_c}")
    if actor.loss_scale_factor is not None and actor.loss_scale_factor <= 0:
        report.error(f"{ARR}.actor.loss_scale_factor", f"must be > 0 or null, got {actor.loss_scale_factor}")
    if cfg.critic.enable and cfg.critic.cliprange_value < 0:
        report.error("critic.cliprange_value", f"must be >= 0, got {cfg.critic.cliprange_value}")


def _check_optim(report: IssueCollector, prefix: str, optim: OptimConfig) -> None:
    if optim.lr < 0:
        report.error(f"{prefix}.lr", f"must be >= 0, got {optim.lr}")
    for index, beta in enumerate(optim.betas):
        if not 0 <= beta < 1:
            report.error(f"{prefix}.betas[{index}]", f"must be in [0, 1), got {beta}")
    if optim.weight_decay < 0:
        report.error(f"{prefix}.weight_decay", f"must be >= 0, got {optim.weight_decay}")
    if optim.clip_grad <= 0:
        report.error(f"{prefix}.clip_grad", f"must be > 0 (max grad norm), got {optim.clip_grad}")
    for key, value in (("lr_warmup_steps_ratio", optim.lr_warmup_steps_ratio), ("min_lr_ratio", optim.min_lr_ratio)):
        if not 0 <= value <= 1:
            report.error(f"{prefix}.{key}", f"must be in [0, 1], got {value}")
    if optim.num_cycles < 0:
        report.error(f"{prefix}.num_cycles", f"must be >= 0, got {optim.num_cycles}")
    if optim.total_training_steps == 0 or optim.total_training_steps < -1:
        report.error(
            f"{prefix}.total_training_steps",
            f"must be -1 (set by the trainer) or >= 1, got {optim.total_training_steps}",
        )


def _check_trainer(cfg: RootConfig, report: IssueCollector) -> None:
    trainer = cfg.trainer
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        report.error(
            "trainer.resume_from_path",
            "must be set when trainer.resume_mode=resume_path (a global_step_N checkpoint folder)",
        )
    elif trainer.resume_from_path and trainer.resume_mode != "resume_path":
        report.warn("trainer.resume_from_path", f"ignored because trainer.resume_mode={trainer.resume_mode}")
    world = world_size(cfg)
    if trainer.controller == "local" and world != 1:
        report.error(
            "trainer.controller",
            f"local runs one in-process worker but the world size is {world} "
            "(trainer.nnodes x trainer.n_gpus_per_node); set trainer.controller=ray or "
            "trainer.n_gpus_per_node=1",
        )
    if trainer.val_only and not trainer.val_before_train:
        # verl checks val_only inside its val_before_train branch: with it false, verl trains as if unset.
        report.error(
            "trainer.val_only",
            "true with trainer.val_before_train=false: verl ignores val_only then and trains; "
            "set trainer.val_before_train=true to only validate, or drop trainer.val_only",
        )
    if trainer.val_only and not cfg.data.val_files:
        report.error("trainer.val_only", "true but data.val_files is null: there is nothing to validate")
    if trainer.test_freq > 0 and not cfg.data.val_files:
        report.warn("trainer.test_freq", f"{trainer.test_freq} but data.val_files is null: no validation will run")
    if trainer.critic_warmup > 0 and not cfg.critic.enable:
        report.warn("trainer.critic_warmup", "has no effect without a critic")
    for prefix, contents in (
        (f"{ARR}.actor.checkpoint", cfg.actor_rollout_ref.actor.checkpoint),
        ("critic.checkpoint", cfg.critic.checkpoint),
    ):
        if not contents.save_contents:
            report.error(f"{prefix}.save_contents", "must name at least one of model, optimizer, extra, hf_model")


def _check_reward(cfg: RootConfig, report: IssueCollector) -> None:
    reward = cfg.reward_model
    if reward.enable and not reward.model.path:
        report.error("reward_model.model.path", "must be set when reward_model.enable is true")
    if reward.timeout_s is not None and reward.timeout_s <= 0:
        report.error("reward_model.timeout_s", f"must be > 0 seconds or null (no limit), got {reward.timeout_s}")
    if reward.micro_batch_size_per_gpu is not None and reward.micro_batch_size_per_gpu < 1:
        report.error("reward_model.micro_batch_size_per_gpu", f"must be >= 1, got {reward.micro_batch_size_per_gpu}")
    if not cfg.custom_reward_function.name:
        report.error("custom_reward_function.name", "must be a function name")


def _check_paths(cfg: RootConfig, report: IssueCollector) -> None:
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        if files is None:
            continue
        if not files:
            report.error(key, "is an empty list; list at least one .parquet/.jsonl file, or set it to null")
        for i, file in enumerate(files):
            if not str(file).strip():
                report.error(f"{key}[{i}]", "is an empty path; write the .parquet/.jsonl file's path")
    if not cfg.actor_rollout_ref.model.path.strip():
        report.error(
            f"{ARR}.model.path",
            "is empty; use 'smollm2-135m-instruct' (built in) or a local HF causal-LM folder",
        )
