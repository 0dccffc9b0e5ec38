"""The signatures of the ``factory`` callables in the spec records (plugin API 2.0).

Each engine factory is called by a worker (:mod:`verl.workers`) or a conformance kit
(:mod:`verl.testing.conformance`) with the resolved run config and the backend's **validated options**:
``options`` is what :func:`verl.config.role_options` built for the role from ``engine_kwargs`` at config
load (an instance of the spec's ``options_cls``, or ``None`` when the spec has none). A factory never reads
``engine_kwargs`` itself, so the rule of which role inherits which options (the critic takes its own; the
reference policy the actor's, overridden by its own) is one rule, in config, for every backend.

A factory may accept more keywords with defaults; it must accept these. Every callable matching one of these
protocols is a valid ``factory`` (functions, classes, ``functools.partial``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from verl.engines.base import CheckpointEngine, RolloutEngine, TrainingEngine
    from verl.platform.base import Platform


@runtime_checkable
class TrainingEngineFactory(Protocol):
    """``factory(config, *, role, model, options, device, world_size, total_training_steps=1) -> TrainingEngine``.

    Args:
        config: the resolved :class:`verl.config.RootConfig` (verl's keys: batch sizes, optim, model section).
        role: ``"actor"`` (trainable policy), ``"ref"`` (forward-only reference policy) or ``"critic"``
            (value model; the engine must have ``compute_values``). A role the engine does not support raises
            ``ValueError`` naming the role.
        model: resolved HF model folder (``pathlib.Path`` / ``str``) or a live ``torch.nn.Module``.
        options: the role's validated options (``spec.options_cls`` instance) or ``None``.
        device: this rank's ``torch.device`` (from the worker's platform).
        world_size: data-parallel size (ranks of the worker group); the per-rank mini-batch is
            ``ppo_mini_batch_size * rollout.n / world_size``.
        total_training_steps: learning-rate schedule horizon (steps).
    """

    def __call__(
        self,
        config: Any,
        *,
        role: str,
        model: Any,
        options: Any,
        device: Any,
        world_size: int,
        total_training_steps: int = 1,
    ) -> TrainingEngine: ...


@runtime_checkable
class RolloutEngineFactory(Protocol):
    """``factory(config, *, model, tokenizer, options, device) -> RolloutEngine``.

    Args:
        config: the resolved :class:`verl.config.RootConfig` (``actor_rollout_ref.rollout.*`` for sampling and
            lengths, ``actor_rollout_ref.model`` for ``trust_remote_code`` / ``override_config``).
        model: resolved HF model folder, or the actor's live module when both specs declare ``share_module``.
        tokenizer: the worker's HF tokenizer.
        options: the validated ``actor_rollout_ref.rollout.engine_kwargs.<name>`` (``spec.options_cls``) or None.
        device: this rank's ``torch.device``.
    """

    def __call__(self, config: Any, *, model: Any, tokenizer: Any, options: Any, device: Any) -> RolloutEngine: ...


@runtime_checkable
class CheckpointEngineFactory(Protocol):
    """``factory(config, *, options, platform) -> CheckpointEngine`` (weight sync trainer -> rollout).

    Args:
        config: the resolved :class:`verl.config.RootConfig` (``actor_rollout_ref.rollout.checkpoint_engine.*``,
            ``actor_rollout_ref.rollout.placement``).
        options: the validated ``actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.<name>`` or None.
        platform: the worker's resolved :class:`verl.platform.Platform` (its collective backend); a factory never
            resolves a platform itself.
    """

    def __call__(self, config: Any, *, options: Any, platform: Platform) -> CheckpointEngine: ...


@runtime_checkable
class PlatformFactory(Protocol):
    """``factory() -> Platform``: called only for the chosen platform, in the process that uses it."""

    def __call__(self) -> Platform: ...


__all__ = ["CheckpointEngineFactory", "PlatformFactory", "RolloutEngineFactory", "TrainingEngineFactory"]
