"""Rewards: rule-based scorers (GSM8K, MATH), verl's ``compute_score`` contract, custom functions, reward manager.

Reward function contract (verl/utils/reward_score/__init__.py):
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict`` where a dict
carries ``"score"`` plus extra keys that are logged per sample.

Importing this package does not import torch; :class:`RewardManager` (which needs torch) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl.rewards._procworker import ScorerSpec
from verl.rewards.custom import load_reward_function
from verl.rewards.default import SUPPORTED_DATA_SOURCES, default_compute_score
from verl.rewards.errors import (
    AllRewardsFailedError,
    RewardConfigError,
    RewardFunctionError,
    RewardFunctionLoadError,
    RewardInputError,
    UnknownDataSourceError,
    UnknownRewardKwargError,
)

if TYPE_CHECKING:  # pragma: no cover
    from verl.rewards.manager import RewardManager

__all__ = [
    "SUPPORTED_DATA_SOURCES",
    "AllRewardsFailedError",
    "RewardConfigError",
    "RewardFunctionError",
    "RewardFunctionLoadError",
    "RewardInputError",
    "RewardManager",
    "ScorerSpec",
    "UnknownDataSourceError",
    "UnknownRewardKwargError",
    "default_compute_score",
    "load_reward_function",
]


def __getattr__(name: str) -> Any:
    if name == "RewardManager":
        from verl.rewards.manager import RewardManager

        return RewardManager
    raise AttributeError(f"module 'verl.rewards' has no attribute {name!r}")
