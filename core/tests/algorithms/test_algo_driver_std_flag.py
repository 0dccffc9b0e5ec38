"""algorithm.norm_adv_by_std_in_grpo reaches every GRPO-family estimator through the driver.

Hand values: scores [1, 0, 2, -1], groups a = rows 0-1, b = rows 2-3, one response token each.
Both group means are 0.5; unbiased stds are sqrt(0.5) and sqrt(4.5).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.algorithms import compute_advantage
from verl.config.schema.algorithm import AlgorithmConfig
from verl.protocol import DataProto

SCORES = [1.0, 0.0, 2.0, -1.0]
CENTRED = [0.5, -0.5, 1.5, -1.5]  # s - group mean
NORMALISED = [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 1.5 / math.sqrt(4.5), -1.5 / math.sqrt(4.5)]


def data():
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor(SCORES, dtype=torch.float32).unsqueeze(-1),
            "response_mask": torch.ones(4, 1),
        },
        non_tensors={
            "uid": np.array(["a", "a", "b", "b"], dtype=object),
            "reward_extra/acc": np.array(SCORES, dtype=object),
        },
    )


def advantages(name, flag, config=None):
    out = compute_advantage(data(), name, norm_adv_by_std_in_grpo=flag, config=config)
    return out.batch["advantages"][:, 0].numpy()


@pytest.mark.parametrize(("flag", "expected"), [(False, CENTRED), (True, NORMALISED)])
def test_grpo_vectorized_equals_grpo_with_the_flag_on_and_off(flag, expected):
    np.testing.assert_allclose(advantages("grpo", flag), expected, atol=1e-5)
    np.testing.assert_allclose(advantages("grpo_vectorized", flag), expected, atol=1e-5)


@pytest.mark.parametrize(("flag", "per_row"), [(False, CENTRED), (True, NORMALISED)])
def test_gdpo_follows_the_flag(flag, per_row):
    algo = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=("acc",), norm_adv_by_std_in_grpo=flag)
    # One component, weight 1: the GRPO values whitened over the 4 tokens (mean 0, unbiased variance).
    var = sum(x * x for x in per_row) / 3
    expected = [x / math.sqrt(var + 1e-8) for x in per_row]
    np.testing.assert_allclose(advantages("gdpo", flag, config=algo), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("flag", "expected"), [(False, [1.0, 0.0, 3.0, 0.0]), (True, [math.sqrt(2), 0, math.sqrt(2), 0])]
)
def test_grpo_passk_reads_the_flag_from_the_config_or_the_driver(flag, expected):
    # Best row per group gets r_max - r_2nd: 1 - 0 in a, 2 - (-1) in b; divided by the std when on.
    algo = AlgorithmConfig(adv_estimator="grpo_passk", norm_adv_by_std_in_grpo=flag)
    np.testing.assert_allclose(advantages("grpo_passk", flag, config=algo), expected, atol=1e-5)
    np.testing.assert_allclose(advantages("grpo_passk", flag), expected, atol=1e-5)
