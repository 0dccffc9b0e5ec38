"""Run configuration: frozen attrs classes with verl's keys, YAML + dotted overrides, validation.

    from verl.config import load_config, ConfigError, to_yaml, RootConfig
    cfg = load_config("run.yaml", ["actor_rollout_ref.rollout.n=4", "algorithm.adv_estimator=grpo"])
    cfg.actor_rollout_ref.rollout.n      # 4

Pipeline (:func:`load_config`): defaults <- YAML file <- overrides -> unknown-key check
(full dotted key, did-you-mean) -> strict cattrs structuring -> fill null follow-values
(:func:`resolve_config`) -> cross-field rules (:func:`validate_config`) -> backend options
and registry names (:func:`validate_backend_options`). Every failure is a :class:`ConfigError`.

The options each engine factory gets (``options=``) come from :func:`role_options`, the rule config load
checks with (:mod:`verl.config.engine_options`).
"""

from verl.config.backend_options import validate_backend_options, validate_registered_names
from verl.config.dump import CONFIG_FILENAME, save_resolved_config, to_dict, to_yaml
from verl.config.engine_options import RoleSelection, role_options, role_selection, structure_options
from verl.config.errors import ConfigError, ConfigIssue
from verl.config.loader import build_config, load_config, read_yaml_file
from verl.config.resolve import get_path, replace_path, resolve_config
from verl.config.schema import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    CheckpointConfig,
    CheckpointEngineConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    KlCtrlConfig,
    ModelConfig,
    OptimConfig,
    PolicyLossConfig,
    RayKwargsConfig,
    RefConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RolloutConfig,
    RootConfig,
    TrainerConfig,
    ValKwargs,
)
from verl.config.validate import validate_config
from verl.config.validate_batch import world_size
from verl.config.validate_lora import serves_lora_adapters

__all__ = [
    "CONFIG_FILENAME",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "CheckpointEngineConfig",
    "ConfigError",
    "ConfigIssue",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "KlCtrlConfig",
    "ModelConfig",
    "OptimConfig",
    "PolicyLossConfig",
    "RayKwargsConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RoleSelection",
    "RolloutConfig",
    "RootConfig",
    "TrainerConfig",
    "ValKwargs",
    "build_config",
    "get_path",
    "load_config",
    "read_yaml_file",
    "replace_path",
    "resolve_config",
    "role_options",
    "serves_lora_adapters",
    "role_selection",
    "save_resolved_config",
    "structure_options",
    "to_dict",
    "to_yaml",
    "validate_backend_options",
    "validate_config",
    "validate_registered_names",
    "world_size",
]
