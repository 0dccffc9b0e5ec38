"""gdpo against a numpy re-implementation of verl's formula, through the function API and the driver."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.algorithms import (
    AdvantageEstimator,
    compute_advantage,
    compute_gdpo_outcome_advantage,
    get_adv_estimator_fn,
)


def t(x, dtype=torch.float64):
    return torch.tensor(np.asarray(x), dtype=dtype)


def np_grpo_rows(scores, index, eps=1e-6):
    out = np.zeros(len(scores))
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g]
        vals = scores[rows]
        mean, std = (0.0, 1.0) if len(rows) == 1 else (vals.mean(), vals.std(ddof=1))
        out[rows] = (vals - mean) / (std + eps)
    return out


def np_whiten(values, mask):
    sel = values[mask > 0]
    mean = sel.mean()
    var = sel.var(ddof=1)
    return (values - mean) / np.sqrt(var + 1e-8) * mask


def np_gdpo(components, weights, index, mask):
    total = sum(
        w * np_grpo_rows(np.asarray(c, dtype=np.float64), index)[:, None] * mask
        for w, c in zip(weights, components, strict=True)
    )
    return np_whiten(total, mask)


# Four rows, two prompts; prompt length 2, response lengths 3, 2, 3, 1.
INDEX = np.array(["p", "p", "q", "q"], dtype=object)
RESP_MASK = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=np.float64)
FORMAT = np.array([1.0, 0.0, 1.0, 1.0])
ACCURACY = np.array([0.0, 1.0, 0.0, 3.0])


def gdpo_batch():
    prompts = torch.ones(4, 2, dtype=torch.long)
    attention = torch.cat([torch.ones(4, 2), t(RESP_MASK, torch.float32)], dim=1)
    batch = {"prompts": prompts, "attention_mask": attention}
    non_tensor = {"format_reward": FORMAT.astype(object), "reward_extra/accuracy_reward": ACCURACY.astype(object)}
    return batch, non_tensor


def test_gdpo_normalises_each_component_then_whitens_the_weighted_sum():
    batch, non_tensor = gdpo_batch()
    cfg = SimpleNamespace(gdpo_reward_keys=["format_reward", "accuracy_reward"], gdpo_reward_weights=[1.0, 0.5])
    rewards = torch.zeros(4, 3)  # ignored when the components are given
    adv, ret = compute_gdpo_outcome_advantage(
        rewards, t(RESP_MASK), INDEX, config=cfg, non_tensor_batch=non_tensor, batch=batch
    )
    expected = np_gdpo([FORMAT, ACCURACY], [1.0, 0.5], list(INDEX), RESP_MASK)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(adv, ret)
    assert torch.count_nonzero(adv[RESP_MASK == 0]) == 0


def test_gdpo_is_not_grpo_of_the_summed_reward():
    """The point of GDPO: the large accuracy component does not drown the format component."""
    batch, non_tensor = gdpo_batch()
    one_group = np.array(["g"] * 4, dtype=object)
    cfg = {"gdpo_reward_keys": ["format_reward", "accuracy_reward"]}
    adv, _ = compute_gdpo_outcome_advantage(
        torch.zeros(4, 3), t(RESP_MASK), one_group, config=cfg, non_tensor_batch=non_tensor, batch=batch
    )
    expected = np_gdpo([FORMAT, ACCURACY], [1, 1], list(one_group), RESP_MASK)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-6)
    summed = np_whiten(np_grpo_rows(FORMAT + ACCURACY, list(one_group))[:, None] * RESP_MASK, RESP_MASK)
    assert np.abs(adv.numpy() - summed).max() > 0.1


def test_component_sits_on_the_last_response_token():
    batch, non_tensor = gdpo_batch()
    seen = {}

    def spy(**kwargs):
        seen["rewards"] = kwargs["token_level_rewards"].clone()
        return kwargs["token_level_rewards"], kwargs["token_level_rewards"]

    import verl.algorithms.advantage_gdpo as mod

    original = mod.compute_grpo_outcome_advantage
    mod.compute_grpo_outcome_advantage = spy
    try:
        compute_gdpo_outcome_advantage(
            torch.zeros(4, 3),
            t(RESP_MASK),
            INDEX,
            config={"gdpo_reward_keys": ["reward_extra/accuracy_reward"]},
            non_tensor_batch=non_tensor,
            batch=batch,
        )
    finally:
        mod.compute_grpo_outcome_advantage = original
    expected = np.zeros((4, 3), dtype=np.float32)
    expected[[0, 1, 2, 3], [2, 1, 2, 0]] = ACCURACY
    np.testing.assert_array_equal(seen["rewards"].numpy(), expected)


def test_without_batch_the_token_rewards_are_the_single_component():
    rewards = np.zeros((4, 3))
    rewards[[0, 1, 2, 3], [2, 1, 2, 0]] = [1.0, 0.0, 2.0, 5.0]
    adv, _ = compute_gdpo_outcome_advantage(t(rewards), t(RESP_MASK), INDEX)
    expected = np_gdpo([rewards.sum(-1)], [1.0], list(INDEX), RESP_MASK)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-6, atol=1e-7)


def test_gdpo_with_singleton_groups():
    batch, non_tensor = gdpo_batch()
    index = np.array(["p", "q", "r", "s"], dtype=object)  # every group has one row: GRPO keeps s (mean 0, std 1)
    adv, _ = compute_gdpo_outcome_advantage(
        torch.zeros(4, 3),
        t(RESP_MASK),
        index,
        config={"gdpo_reward_keys": ["format_reward"]},
        non_tensor_batch=non_tensor,
        batch=batch,
    )
    expected = np_whiten(FORMAT[:, None] / (1 + 1e-6) * RESP_MASK, RESP_MASK)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_errors_name_the_key_and_the_fix():
    batch, non_tensor = gdpo_batch()
    call = lambda cfg, nt=non_tensor: compute_gdpo_outcome_advantage(  # noqa: E731
        torch.zeros(4, 3), t(RESP_MASK), INDEX, config=cfg, non_tensor_batch=nt, batch=batch
    )
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        call({"gdpo_reward_keys": None})
    with pytest.raises(KeyError, match="'speed'.*compute_score must return a dict"):
        call({"gdpo_reward_keys": ["speed"]})
    with pytest.raises(ValueError, match="2 entries for 1 gdpo_reward_keys"):
        call({"gdpo_reward_keys": ["format_reward"], "gdpo_reward_weights": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"one finite number per row.*rows \[1\]"):
        call({"gdpo_reward_keys": ["format_reward"]}, {"format_reward": np.array([1.0, None, 0.0, 1.0], dtype=object)})


def test_driver_passes_the_raw_columns_as_our_trainer_stores_them():
    protocol = pytest.importorskip("verl.protocol")
    from verl.config.schema.algorithm import AlgorithmConfig

    batch, _ = gdpo_batch()
    data = protocol.DataProto.from_dict(
        tensors={"token_level_rewards": torch.zeros(4, 3), "response_mask": t(RESP_MASK, torch.float32), **batch},
        non_tensors={
            "uid": INDEX,
            "reward_extra/format_reward": FORMAT.astype(object),
            "reward_extra/accuracy_reward": ACCURACY.astype(object),
        },
    )
    algo = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=("format_reward", "accuracy_reward"))
    out = compute_advantage(data, AdvantageEstimator.GDPO, config=algo)
    expected = np_gdpo([FORMAT, ACCURACY], [1, 1], list(INDEX), RESP_MASK)
    np.testing.assert_allclose(out.batch["advantages"].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert get_adv_estimator_fn("gdpo") is compute_gdpo_outcome_advantage
