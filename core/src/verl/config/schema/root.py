"""The root of the config tree (verl ``ppo_trainer.yaml``)."""

from __future__ import annotations

import attrs

from verl.config.schema._fields import section
from verl.config.schema.actor import ActorConfig, RefConfig
from verl.config.schema.algorithm import AlgorithmConfig
from verl.config.schema.critic import CriticConfig
from verl.config.schema.data import DataConfig
from verl.config.schema.model import ModelConfig
from verl.config.schema.reward import CustomRewardFunctionConfig, RewardModelConfig
from verl.config.schema.rollout import RolloutConfig
from verl.config.schema.trainer import RayKwargsConfig, TrainerConfig


@attrs.frozen(kw_only=True)
class ActorRolloutRefConfig:
    """The policy's roles: training (actor), generation (rollout) and the frozen reference (ref)."""

    model: ModelConfig = section(ModelConfig, doc="the policy model")
    actor: ActorConfig = section(ActorConfig, doc="policy training")
    rollout: RolloutConfig = section(RolloutConfig, doc="response generation")
    ref: RefConfig = section(RefConfig, doc="reference-policy log-probs")


@attrs.frozen(kw_only=True)
class RootConfig:
    """A whole run's config. Build it with :func:`verl.config.load_config`, which fills in
    the null "follow" values (e.g. ``critic.ppo_mini_batch_size`` = actor's) and validates."""

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
