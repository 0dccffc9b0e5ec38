"""Factory of the ``fsdp`` training engine: reads the run config like the reference builder, and gets its
options validated (``options=``; it never reads ``engine_kwargs``).

Kept free of torch imports at module level (the plugin hook imports it when listing engines).
"""

from __future__ import annotations

from typing import Any

import attrs


def build_fsdp_training_engine(
    config: Any,
    *,
    role: str,
    model: Any,
    options: Any,
    total_training_steps: int = 1,
    device: Any = "cpu",
    world_size: int = 1,
) -> Any:
    """Build the ``actor`` (trainable), ``ref`` (forward-only) or ``critic`` (value model) FSDP engine.

    ``critic`` returns a :class:`verl_fsdp.engine.FSDPCriticEngine` with the batch settings of
    :func:`verl.engines.reference.builders.critic_settings`.

    Args:
        config: resolved :class:`verl.config.RootConfig`; bucket size from
            ``actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes``.
        role: ``"actor"``, ``"ref"`` or ``"critic"``.
        model: resolved HF folder (or a live module).
        options: the role's validated :class:`verl_fsdp.options.FSDPEngineOptions` (core's
            ``verl.config.role_options(config, role, spec)``: ``critic.engine_kwargs.fsdp`` = verl's
            ``critic.model.fsdp_config`` for the critic; ``ref.engine_kwargs.fsdp`` over the actor's for the
            reference policy); None = the defaults.
        total_training_steps: LR-schedule horizon.
        device: this rank's torch device (from the platform).
        world_size: data-parallel size; the per-rank mini-batch is ``ppo_mini_batch_size * n / world_size``.
            It must equal the process group's size (the group is joined here if not yet initialised).

    Raises:
        ValueError: unknown role, or ``world_size`` differs from the process group's size.
        TypeError: ``options`` is not an :class:`~verl_fsdp.options.FSDPEngineOptions` (e.g. a raw dict).
    """
    import torch.distributed as dist

    from verl.engines.reference.builders import role_settings
    from verl_fsdp.dist import ensure_process_group
    from verl_fsdp.engine import DIST_BACKENDS, FSDPCriticEngine, FSDPTrainingEngine
    from verl_fsdp.options import FSDPEngineOptions

    if role not in ("actor", "ref", "critic"):
        raise ValueError(f"fsdp training engine: role must be 'actor', 'ref' or 'critic', got {role!r}")
    if options is not None and not isinstance(options, FSDPEngineOptions):
        raise TypeError(
            "fsdp training engine: options must be an FSDPEngineOptions (verl.config.role_options(cfg, role, spec)) "
            f"or None, got {type(options).__name__}"
        )
    opts = options if options is not None else FSDPEngineOptions()
    rollout = config.actor_rollout_ref.rollout
    engine_cls: Any = FSDPTrainingEngine
    extra: dict[str, Any] = {}
    if role == "critic":
        engine_cls = FSDPCriticEngine
        extra["trust_remote_code"] = config.critic.model.trust_remote_code
    settings, optim = role_settings(config, role, world_size=world_size, dtype=opts.model_dtype, engine="fsdp")
    if role != "critic":  # verl's fsdp_config.{use_torch_compile, entropy_*} over the role's keys
        settings = attrs.evolve(settings, **opts.token_stats_overrides())
    device_type = getattr(device, "type", str(device).split(":")[0])
    ensure_process_group(
        DIST_BACKENDS.get(device_type, "gloo"), timeout_s=getattr(config.actor_rollout_ref, "nccl_timeout", None)
    )
    if dist.get_world_size() != world_size:
        raise ValueError(
            f"fsdp training engine: world_size={world_size} but the process group has {dist.get_world_size()} ranks; "
            "the worker group and torch.distributed must agree"
        )
    return engine_cls(
        model,
        settings,
        options=opts,
        optim=optim,
        total_training_steps=total_training_steps,
        device=device,
        bucket_megabytes=rollout.checkpoint_engine.update_weights_bucket_megabytes,
        **extra,
    )
