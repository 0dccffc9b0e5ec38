"""Factories that turn the run config into reference engines (used by the built-in plugin).

``config`` is a resolved :class:`verl.config.RootConfig` (from ``load_config``): follow-values
such as ``rollout.response_length`` and ``*.log_prob_*`` are already filled from ``data`` and
``actor`` there. Each factory reads verl's config keys for one role and gets the role's validated options
(``options=``, :func:`verl.config.role_options`; it never reads ``engine_kwargs``); they are the
``factory`` of the ``reference`` training engine, the ``hf`` rollout engine and the
``colocated`` checkpoint engine specs in :mod:`verl.plugins.builtin`.
"""

from __future__ import annotations

from typing import Any

import attrs

from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine


@attrs.frozen(kw_only=True)
class ReferenceEngineOptions:
    """Options of the ``reference`` training engine (``actor_rollout_ref.actor.engine_kwargs.reference``).

    Attributes:
        dtype: parameter dtype; ``float32`` (default) is the CPU dtype, bf16 matmuls are ~6x slower there.
        param_offload: keep the weights in host memory between uses (verl's ``fsdp_config.param_offload``):
            :meth:`~verl.engines.reference.training.ReferenceTrainingEngine.offload` moves them there while the
            rollout generates; meaningless on CPU (nothing moves).
        optimizer_offload: the same for the optimizer state (``fsdp_config.optimizer_offload``).
    """

    dtype: str = attrs.field(default="float32", validator=attrs.validators.in_(["float32", "bfloat16", "float16"]))
    param_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    optimizer_offload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@attrs.frozen(kw_only=True)
class HFRolloutOptions:
    """Options of the ``hf`` rollout engine (``actor_rollout_ref.rollout.engine_kwargs.hf``).

    Attributes:
        sleep_level: what ``sleep()`` frees of weights the engine owns (a model it loaded, not the trainer's
            shared module): 1 = move them to host memory on an accelerator (nothing on CPU); 2 = discard them
            (any device; the trainer's next weight sync refills them), verl's default for vLLM on CUDA.
    """

    sleep_level: int = attrs.field(default=2, validator=attrs.validators.in_([1, 2]))


def _checked_options(options: Any, cls: type, name: str) -> Any:
    """``options`` as ``cls``: None means the defaults; anything else is a caller error (the factory gets the
    instance :func:`verl.config.role_options` built, never the raw ``engine_kwargs``)."""
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise TypeError(
            f"{name}: options must be a {cls.__name__} (verl.config.role_options(cfg, role, spec)) or None, "
            f"got {type(options).__name__}"
        )
    return options


def build_reference_training_engine(
    config: Any,
    *,
    role: str,
    model: Any,
    options: ReferenceEngineOptions | None,
    total_training_steps: int = 1,
    device: Any = "cpu",
    world_size: int = 1,
) -> ReferenceTrainingEngine:
    """Build the ``actor`` (trainable), ``ref`` (forward-only) or ``critic`` (value model) engine.

    ``critic`` reads ``critic.*`` (batch sizes already resolved from the actor's when null) and returns a
    :class:`verl.engines.reference.critic.ReferenceCriticEngine`; its forward passes (``compute_values``)
    use the training micro-batch settings, as verl's critic does by default.

    Args:
        config: :class:`verl.config.RootConfig`.
        role: ``"actor"``, ``"ref"`` or ``"critic"``.
        model: resolved HF folder (or a live module).
        options: the role's validated :class:`ReferenceEngineOptions` (``verl.config.role_options(config, role,
            spec)``: the critic's own, the reference policy's over the actor's); None = the defaults.
        total_training_steps: LR-schedule horizon.
        device: torch device.
        world_size: data-parallel size; the mini-batch per rank is ``ppo_mini_batch_size * n / world_size``.

    Raises:
        ValueError: unknown role.
        TypeError: ``options`` is not a :class:`ReferenceEngineOptions` (e.g. a raw dict).
    """
    opts = _checked_options(options, ReferenceEngineOptions, "reference training engine")
    settings, optim = role_settings(config, role, world_size=world_size, dtype=opts.dtype, engine="reference")
    if role == "critic":
        from verl.engines.reference.critic import ReferenceCriticEngine

        return ReferenceCriticEngine(
            model,
            settings,
            optim=optim,
            total_training_steps=total_training_steps,
            device=device,
            trust_remote_code=config.critic.model.trust_remote_code,
            param_offload=opts.param_offload,
            optimizer_offload=opts.optimizer_offload,
        )
    return ReferenceTrainingEngine(
        model,
        settings,
        optim=optim,
        total_training_steps=total_training_steps,
        device=device,
        param_offload=opts.param_offload,
        optimizer_offload=opts.optimizer_offload,
    )


def role_settings(
    config: Any, role: str, *, world_size: int = 1, dtype: str = "float32", engine: str = "training"
) -> tuple[EngineSettings, Any]:
    """``(EngineSettings, optim section or None)`` of one role, from verl's keys (shared by every engine).

    * ``actor``: ``actor.ppo_*`` (mini-batch per rank = ``ppo_mini_batch_size * rollout.n / world_size``),
      ``rollout.log_prob_*`` for its forward passes, ``actor.optim``, the LoRA keys of ``model.*``;
    * ``ref``: ``ref.log_prob_*``, forward-only (optim ``None``);
    * ``critic``: :func:`critic_settings`, ``critic.optim``.

    Raises:
        ValueError: unknown role (``engine`` names the engine in the message).
    """
    arr = config.actor_rollout_ref
    actor, rollout, ref = arr.actor, arr.rollout, arr.ref
    if role == "critic":
        return critic_settings(config, world_size=world_size, dtype=dtype), config.critic.optim
    if role == "actor":
        settings = EngineSettings(
            mini_batch_size=actor.ppo_mini_batch_size * rollout.n // world_size,
            micro_batch_size=actor.ppo_micro_batch_size_per_gpu,
            use_dynamic_bsz=actor.use_dynamic_bsz,
            max_token_len=actor.ppo_max_token_len_per_gpu,
            ppo_epochs=actor.ppo_epochs,
            shuffle=actor.shuffle,
            data_loader_seed=actor.data_loader_seed,
            infer_micro_batch_size=rollout.log_prob_micro_batch_size_per_gpu,
            infer_use_dynamic_bsz=rollout.log_prob_use_dynamic_bsz,
            infer_max_token_len=rollout.log_prob_max_token_len_per_gpu,
            clip_grad=actor.optim.clip_grad,
            dtype=dtype,
            gradient_checkpointing=arr.model.enable_gradient_checkpointing,
            use_remove_padding=arr.model.use_remove_padding,
            trust_remote_code=arr.model.trust_remote_code,
            override_config=dict(arr.model.override_config),
            enable_activation_offload=arr.model.enable_activation_offload,
            lora=lora_settings(arr.model),
            **_token_stats_settings(arr.model, actor, actor.use_torch_compile),
        )
        return settings, actor.optim
    if role == "ref":
        settings = EngineSettings(
            infer_micro_batch_size=ref.log_prob_micro_batch_size_per_gpu,
            infer_use_dynamic_bsz=ref.log_prob_use_dynamic_bsz,
            infer_max_token_len=ref.log_prob_max_token_len_per_gpu,
            dtype=dtype,
            use_remove_padding=arr.model.use_remove_padding,
            trust_remote_code=arr.model.trust_remote_code,
            override_config=dict(arr.model.override_config),
            # verl: ref.use_torch_compile = ${oc.select:actor_rollout_ref.actor.use_torch_compile,true}
            **_token_stats_settings(
                arr.model, ref, actor.use_torch_compile if ref.use_torch_compile is None else ref.use_torch_compile
            ),
        )
        return settings, None
    raise ValueError(f"{engine} training engine: role must be 'actor', 'ref' or 'critic', got {role!r}")


def lora_settings(model: Any) -> Any:
    """:class:`verl.engines.lora.LoraSettings` from ``actor_rollout_ref.model.*``, or None when ``lora_rank`` is 0."""
    if model.lora_rank <= 0:
        return None
    from verl.engines.lora import LoraSettings

    return LoraSettings(
        rank=model.lora_rank,
        alpha=model.lora_alpha,
        target_modules=model.target_modules,
        exclude_modules=model.exclude_modules,
        adapter_path=model.lora_adapter_path,
        base_model=model.path,
    )


def _token_stats_settings(model: Any, role: Any, use_torch_compile: bool) -> dict[str, Any]:
    """:class:`EngineSettings` fields of the log-prob/entropy computation from ``model.*`` and the role's keys."""
    return {
        "use_torch_compile": bool(use_torch_compile),
        "entropy_from_logits_with_chunking": role.entropy_from_logits_with_chunking,
        "entropy_from_logits_chunk_size": role.entropy_from_logits_chunk_size,
        "entropy_checkpointing": role.entropy_checkpointing,
        "use_fused_kernels": model.use_fused_kernels,
        "fused_kernels_backend": model.fused_kernel_options.impl_backend,
    }


def critic_settings(config: Any, *, world_size: int = 1, dtype: str = "float32") -> EngineSettings:
    """:class:`EngineSettings` of the critic from ``critic.*`` (shared by the reference and FSDP builders).

    Mini-batch per rank = ``critic.ppo_mini_batch_size * rollout.n / world_size``; forward passes
    (``compute_values``) use the same micro-batch size / token budget as training (verl's
    ``forward_micro_batch_size_per_gpu`` and ``forward_max_token_len_per_gpu`` default to them). The value
    model is loaded with ``critic.model.{trust_remote_code, override_config}`` and packs sequences when
    ``critic.model.use_remove_padding`` (verl's default, true).
    """
    critic = config.critic
    n = config.actor_rollout_ref.rollout.n
    return EngineSettings(
        mini_batch_size=critic.ppo_mini_batch_size * n // world_size,
        micro_batch_size=critic.ppo_micro_batch_size_per_gpu,
        use_dynamic_bsz=bool(critic.use_dynamic_bsz),
        max_token_len=critic.ppo_max_token_len_per_gpu,
        ppo_epochs=critic.ppo_epochs,
        shuffle=bool(critic.shuffle),
        data_loader_seed=config.actor_rollout_ref.actor.data_loader_seed,
        infer_micro_batch_size=critic.ppo_micro_batch_size_per_gpu,
        infer_use_dynamic_bsz=bool(critic.use_dynamic_bsz),
        infer_max_token_len=critic.ppo_max_token_len_per_gpu,
        clip_grad=critic.optim.clip_grad,
        dtype=dtype,
        gradient_checkpointing=critic.model.enable_gradient_checkpointing,
        use_remove_padding=critic.model.use_remove_padding,
        trust_remote_code=critic.model.trust_remote_code,
        override_config=dict(critic.model.override_config),
    )


def build_hf_rollout_engine(
    config: Any, *, model: Any, tokenizer: Any, options: HFRolloutOptions | None, device: Any = "cpu"
) -> Any:
    """Build the ``hf`` rollout engine for ``actor_rollout_ref.rollout`` (``model`` may be a live module).

    ``options``: the validated :class:`HFRolloutOptions` (``verl.config.role_options(config, "rollout",
    spec)``), None = the defaults. A model loaded from a path gets ``actor_rollout_ref.model.{trust_remote_code,
    override_config}``, as the actor does (verl passes ``model.trust_remote_code`` to its rollout engines too).

    Raises:
        TypeError: ``options`` is not an :class:`HFRolloutOptions`.
    """
    from verl.engines.reference.rollout import build_hf_rollout

    opts = _checked_options(options, HFRolloutOptions, "hf rollout engine")
    arr = config.actor_rollout_ref
    return build_hf_rollout(arr.rollout, model, tokenizer, device=device, model_config=arr.model, options=opts)
