"""The root of the config tree (verl ``ppo_trainer.yaml``)."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import fld, section
from verl.config.schema.actor import ActorConfig, RefConfig
from verl.config.schema.algorithm import AlgorithmConfig
from verl.config.schema.async_training import AsyncTrainingConfig
from verl.config.schema.critic import CriticConfig
from verl.config.schema.data import DataConfig
from verl.config.schema.model import ModelConfig
from verl.config.schema.reward import CustomRewardFunctionConfig, RewardModelConfig
from verl.config.schema.rollout import RolloutConfig
from verl.config.schema.trainer import RayKwargsConfig, TrainerConfig


@attrs.frozen(kw_only=True)
class ActorRolloutRefConfig:
    """The policy's roles: training (actor), generation (rollout) and the frozen reference (ref).

    ``nccl_timeout`` (verl's name; it applies to whichever backend the platform uses, gloo/nccl/hccl) is the
    ``timeout`` of the workers' ``torch.distributed`` process group: how long a collective waits for the
    other ranks before failing.
    """

    nccl_timeout: int = fld(600, doc="torch.distributed process-group timeout of the workers, in seconds")

    model: ModelConfig = section(ModelConfig, doc="the policy model")
    actor: ActorConfig = section(ActorConfig, doc="policy training")
    rollout: RolloutConfig = section(RolloutConfig, doc="response generation")
    ref: RefConfig = section(RefConfig, doc="reference-policy log-probs")


# verl's model_engine config groups (verl/trainer/config/model_engine/*.yaml).
ModelEngine = Literal["dp", "megatron", "veomni", "torchtitan"]


@attrs.frozen(kw_only=True)
class RootConfig:
    """A whole run's config. Build it with :func:`verl.config.load_config`, which fills in
    the null "follow" values (e.g. ``critic.ppo_mini_batch_size`` = actor's) and validates.

    ``model_engine`` is verl's engine family, which picks the actor/ref/critic config groups and with them
    the default ``strategy``: ``dp`` (verl's default; strategies ``fsdp``/``fsdp2``, and core's ``reference``
    here) leaves the strategies to their own rule; ``megatron``, ``veomni``, ``torchtitan`` make a null
    ``actor.strategy`` that engine (and refuse an explicit strategy of another family), so the run needs
    that training-engine plugin (Megatron: #17; no veomni or torchtitan plugin exists).
    """

    data: DataConfig = section(DataConfig, doc="dataset, lengths and batch size")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, doc="policy model and its roles")
    critic: CriticConfig = section(CriticConfig, doc="value model (GAE)")
    reward_model: RewardModelConfig = section(RewardModelConfig, doc="reward computation")
    custom_reward_function: CustomRewardFunctionConfig = section(
        CustomRewardFunctionConfig, doc="user scorer loaded from a file"
    )
    algorithm: AlgorithmConfig = section(AlgorithmConfig, doc="advantage estimator and in-reward KL")
    trainer: TrainerConfig = section(TrainerConfig, doc="loop, logging, checkpoints, placement")
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig, doc="Ray options")
    model_engine: ModelEngine = fld("dp", doc="engine family: dp (fsdp/reference)|megatron|veomni|torchtitan")
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, doc="one-step off-policy training (staleness_threshold)"
    )
