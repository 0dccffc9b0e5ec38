"""attrs classes of the config tree, one module per section; verl's key names and defaults."""

from verl.config.schema.actor import ActorConfig, LossAggMode, PolicyLossConfig, RefConfig
from verl.config.schema.algorithm import AlgorithmConfig, FilterGroupsConfig, KlCtrlConfig
from verl.config.schema.async_training import AsyncTrainingConfig
from verl.config.schema.critic import CriticConfig
from verl.config.schema.data import DataConfig
from verl.config.schema.model import CriticModelConfig, ModelConfig
from verl.config.schema.optim import CheckpointConfig, OptimConfig
from verl.config.schema.reward import CustomRewardFunctionConfig, RewardModelConfig, RewardModelModelConfig
from verl.config.schema.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    MultiTurnConfig,
    RolloutConfig,
    ValKwargs,
)
from verl.config.schema.root import ActorRolloutRefConfig, RootConfig
from verl.config.schema.trainer import RayKwargsConfig, TrainerConfig

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "AsyncTrainingConfig",
    "CheckpointConfig",
    "AgentLoopConfig",
    "CheckpointEngineConfig",
    "MultiTurnConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FilterGroupsConfig",
    "KlCtrlConfig",
    "LossAggMode",
    "ModelConfig",
    "OptimConfig",
    "PolicyLossConfig",
    "RayKwargsConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "RootConfig",
    "TrainerConfig",
    "ValKwargs",
]
