"""Factory of the ``megatron`` training engine: the run config's batch keys, validated options, the layout's DP size.

Kept free of torch and megatron imports at module level (the plugin hook imports it when listing engines).
"""

from __future__ import annotations

from typing import Any

KEY = "actor_rollout_ref.actor"


def _refusals(settings: Any, role: str) -> list[str]:
    """Role keys this engine cannot honour (each names the key and the way out)."""
    out = []
    section = "critic.model" if role == "critic" else "actor_rollout_ref.model"
    if settings.use_fused_kernels:
        out.append(
            f"{section}.use_fused_kernels=true: the megatron engine computes log-probs and entropy from this rank's "
            "vocabulary slice of the logits (never gathered); the fused-head kernels are not built for it; set false"
        )
    if settings.enable_activation_offload:
        out.append(
            f"{section}.enable_activation_offload=true is not built in the megatron engine; set it to false "
            "(Megatron's recompute: enable_gradient_checkpointing or override_transformer_config.recompute_*)"
        )
    if settings.entropy_from_logits_with_chunking:
        out.append(
            f"{KEY}.entropy_from_logits_with_chunking=true: the megatron engine's entropy is computed per vocabulary "
            "slice of the tensor-parallel group, without chunking; set it to false"
        )
    return out


def build_megatron_training_engine(
    config: Any,
    *,
    role: str,
    model: Any,
    options: Any,
    total_training_steps: int = 1,
    device: Any = "cpu",
    world_size: int = 1,
) -> Any:
    """Build the ``actor`` (trainable), ``ref`` (forward-only) or ``critic`` (value model) Megatron engine.

    Args:
        config: resolved :class:`verl.config.RootConfig`.
        role: ``"actor"``, ``"ref"`` or ``"critic"`` (:class:`~verl_megatron.engine.MegatronCriticEngine`, options
            from ``critic.engine_kwargs.megatron``, batch keys from ``critic.*``).
        model: resolved HF folder (safetensors).
        options: the role's validated :class:`verl_megatron.options.MegatronEngineOptions` (None = defaults).
        total_training_steps: LR-schedule horizon.
        device: this rank's torch device.
        world_size: ranks of the worker group; the data-parallel size is ``world_size / (tp * pp * cp)`` and the
            per-rank mini-batch ``ppo_mini_batch_size * n / dp``.

    Raises:
        ValueError: unknown role, role keys the engine cannot honour, a bad layout.
        TypeError: ``options`` of another class.
    """
    from verl.config import ConfigError, ConfigIssue
    from verl.engines.reference.builders import role_settings
    from verl_megatron.engine import MegatronCriticEngine, MegatronTrainingEngine
    from verl_megatron.options import MegatronEngineOptions

    if role not in ("actor", "ref", "critic"):
        raise ValueError(f"megatron training engine: role must be 'actor', 'ref' or 'critic', got {role!r}")
    if options is not None and not isinstance(options, MegatronEngineOptions):
        raise TypeError(
            "megatron training engine: options must be a MegatronEngineOptions (verl.config.role_options(cfg, role, "
            f"spec)) or None, got {type(options).__name__}"
        )
    opts = options if options is not None else MegatronEngineOptions()
    device_type = getattr(device, "type", str(device).split(":")[0])
    model_parallel = opts.model_parallel_size()
    if world_size % model_parallel:
        raise ConfigError(
            ConfigIssue(
                f"{KEY}.engine_kwargs.megatron.tensor_model_parallel_size",
                f"tensor x pipeline x context parallel sizes = {model_parallel} must divide the {world_size} training "
                "ranks (trainer.nnodes x trainer.n_gpus_per_node)",
            )
        )
    dp = world_size // model_parallel
    settings, optim = role_settings(
        config, role, world_size=dp, dtype=opts.resolved_dtype(device_type), engine="megatron"
    )
    refused = _refusals(settings, role)
    if refused:
        raise ConfigError([ConfigIssue(KEY, message) for message in refused])
    engine_cls = MegatronCriticEngine if role == "critic" else MegatronTrainingEngine
    return engine_cls(
        model,
        settings,
        options=opts,
        optim=optim if role in ("actor", "critic") else None,
        total_training_steps=total_training_steps,
        device=device,
        world_size=world_size,
        bucket_megabytes=config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes,
    )
