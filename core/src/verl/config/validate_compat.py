"""Rules for verl keys kept so verl's scripts load: engine family, strategies, old names and switches.

* ``model_engine`` other than ``dp`` names the training engine; an explicit ``strategy`` of another family
  (actor, ref or critic) is refused, as verl's config groups would never combine them;
* ``actor.grad_clip`` (verl's dp_actor.yaml keeps it, its engines clip at ``optim.clip_grad``): set, it must equal
  ``actor.optim.clip_grad``, since verl ignores it and a different value would not do what it says;
* ``optim.min_lr`` (Megatron's floor): in ``[0, lr]``, not together with ``min_lr_ratio > 0``; a warning when
  the schedule is constant (it never decays, so the floor is never reached, as in Megatron);
* ``checkpoint.strict=false`` and ``trainer.use_legacy_worker_impl=enable``: refused with the reason;
* ``actor_rollout_ref.nccl_timeout`` >= 1 second; ``rollout.cudagraph_capture_sizes`` positive batch sizes;
* ``actor/ref/critic.ulysses_sequence_parallel_size``: only 1 (Ulysses sequence parallelism is not built).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.schema import OptimConfig, RootConfig
from verl.config.validate_batch import ARR


def check_compat(cfg: RootConfig, report: IssueCollector) -> None:
    """Add the errors and warnings of the module docstring's rules to ``report`` (``cfg`` resolved)."""
    _check_model_engine(cfg, report)
    actor = cfg.actor_rollout_ref.actor
    if actor.grad_clip is not None and actor.grad_clip != actor.optim.clip_grad:
        report.error(
            f"{ARR}.actor.grad_clip",
            f"={actor.grad_clip}, but gradients are clipped at {ARR}.actor.optim.clip_grad={actor.optim.clip_grad} "
            "(verl's engines read only optim.clip_grad and ignore actor.grad_clip); set "
            f"{ARR}.actor.optim.clip_grad={actor.grad_clip} instead",
        )
    _check_min_lr(report, f"{ARR}.actor.optim", actor.optim)
    if cfg.critic.enable:
        _check_min_lr(report, "critic.optim", cfg.critic.optim)
    for prefix, checkpoint in (
        (f"{ARR}.actor.checkpoint", actor.checkpoint),
        ("critic.checkpoint", cfg.critic.checkpoint),
    ):
        if not checkpoint.strict:
            report.error(
                f"{prefix}.strict",
                "=false: verl reads it only when Megatron saves hf_model weights into a checkpoint (its bridge's "
                "strict export check); checkpoints here never hold HF weights (`verl export` writes them), so "
                "there is nothing to relax: remove the key",
            )
    if cfg.trainer.use_legacy_worker_impl == "enable":
        report.error(
            "trainer.use_legacy_worker_impl",
            "=enable selects verl's legacy fsdp_workers, which verl has removed and this package never had; the "
            "engine-based workers are the only implementation: use auto or disable (or remove the key)",
        )
    if cfg.actor_rollout_ref.nccl_timeout < 1:
        report.error(f"{ARR}.nccl_timeout", f"must be >= 1 second, got {cfg.actor_rollout_ref.nccl_timeout}")
    for prefix, role in ((f"{ARR}.actor", actor), (f"{ARR}.ref", cfg.actor_rollout_ref.ref), ("critic", cfg.critic)):
        if role.ulysses_sequence_parallel_size != 1:
            report.error(
                f"{prefix}.ulysses_sequence_parallel_size",
                f"={role.ulysses_sequence_parallel_size}: Ulysses sequence parallelism (verl splits each sequence "
                "over this many ranks and exchanges attention heads by all-to-all) is not built here; only 1 (no "
                "sequence parallelism, verl's default) is accepted: set it to 1 or remove it",
            )
    sizes = cfg.actor_rollout_ref.rollout.cudagraph_capture_sizes
    if sizes is not None and (not sizes or any(size < 1 for size in sizes)):
        report.error(
            f"{ARR}.rollout.cudagraph_capture_sizes",
            f"must list batch sizes >= 1 (or be null for the backend's default), got {list(sizes)}",
        )


def _check_model_engine(cfg: RootConfig, report: IssueCollector) -> None:
    engine = cfg.model_engine
    if engine == "dp":
        return  # verl's default group: the strategies choose freely, as before model_engine existed
    for key, value in (
        (f"{ARR}.actor.strategy", cfg.actor_rollout_ref.actor.strategy),
        (f"{ARR}.ref.strategy", cfg.actor_rollout_ref.ref.strategy),
        ("critic.strategy", cfg.critic.strategy if cfg.critic.enable else None),
    ):
        if value is not None and value != engine:
            report.error(
                key,
                f"={value!r}, but model_engine={engine} selects the {engine} engine for every role (verl's "
                f"{engine}_actor/_ref/_critic configs); set {key}={engine} or model_engine=dp",
            )


def _check_min_lr(report: IssueCollector, prefix: str, optim: OptimConfig) -> None:
    if optim.min_lr is None:
        return
    if not 0 <= optim.min_lr <= optim.lr:
        report.error(f"{prefix}.min_lr", f"must be in [0, {prefix}.lr={optim.lr}], got {optim.min_lr}")
    elif optim.min_lr_ratio > 0:
        report.error(
            f"{prefix}.min_lr",
            f"and {prefix}.min_lr_ratio={optim.min_lr_ratio} both set the cosine schedule's final lr; keep one",
        )
    elif optim.lr_scheduler_type == "constant":
        report.warn(
            f"{prefix}.min_lr",
            f"has no effect with {prefix}.lr_scheduler_type=constant (the lr never decays); set cosine to decay to it",
        )
