"""grpo_vectorized / rloo_vectorized against numpy loops of verl's formulas and against the loop estimators."""

import numpy as np
import pytest
import torch

from verl.algorithms import (
    AdvantageEstimator,
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    get_adv_estimator_fn,
)
from verl.algorithms.advantage_vectorized import as_torch_index, group_mean_std


def t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def np_grpo(scores, index, valid, eps=1e-6, norm=True):
    """Per-row GRPO advantage with a Python loop over groups (statistics over valid rows only)."""
    out = np.zeros(len(scores))
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g and valid[i]]
        vals = np.array([scores[i] for i in rows])
        if len(rows) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = vals.mean(), vals.std(ddof=1)
        for i in rows:
            out[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return out


def np_rloo_vectorized(scores, index, valid):
    out = np.zeros(len(scores))
    for g in set(index):
        rows = [i for i, x in enumerate(index) if x == g and valid[i]]
        c = len(rows)
        total = sum(scores[i] for i in rows)
        for i in rows:
            out[i] = (c * scores[i] - total) / (c - 1) if c > 1 else 0.0
    return out


def random_batch(seed, n_rows=12, width=5, empty_rows=(3,)):
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, width + 1, n_rows)
    mask = (np.arange(width)[None, :] < lens[:, None]).astype(float)
    for row in empty_rows:
        mask[row] = 0.0
    rewards = rng.normal(size=(n_rows, width))
    index = np.array(["a", "a", "a", "b", "b", "b", "b", "c", "d", "d", "e", "e"][:n_rows], dtype=object)
    return rewards, mask, index


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_vectorized_matches_numpy_loop_and_the_loop_estimator(seed, norm):
    rewards, mask, index = random_batch(seed)
    scores = (rewards * mask).sum(-1)
    valid = mask.sum(-1) > 0
    expected = np_grpo(scores, list(index), valid, norm=norm)[:, None] * mask
    adv, ret = compute_grpo_vectorized_outcome_advantage(t(rewards), t(mask), index, norm_adv_by_std_in_grpo=norm)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert torch.equal(adv, ret)
    loop, _ = compute_grpo_outcome_advantage(t(rewards), t(mask), index, norm_adv_by_std_in_grpo=norm)
    np.testing.assert_allclose(adv.numpy(), loop.numpy(), rtol=1e-12, atol=1e-12)


def test_grpo_vectorized_by_hand():
    # group a: scores 1, 0 -> mean 0.5, unbiased std 0.70711 -> ±0.70711; group b (one row): mean 0, std 1.
    rewards = [[0, 1], [0, 0], [0, 3]]
    mask = [[1, 1], [1, 1], [1, 0]]  # row 2's reward sits on a padded slot: its score is 0
    adv, _ = compute_grpo_vectorized_outcome_advantage(t(rewards), t(mask), ["a", "a", "b"], epsilon=0.0)
    np.testing.assert_allclose(adv.numpy(), [[0.70711, 0.70711], [-0.70711, -0.70711], [0.0, 0.0]], atol=1e-5)


def test_grpo_vectorized_equal_scores_give_zero_even_with_zero_epsilon():
    adv, _ = compute_grpo_vectorized_outcome_advantage(
        t([[0.1], [0.1], [0.1]]), t([[1], [1], [1]]), [7, 7, 7], epsilon=0.0
    )
    assert torch.isfinite(adv).all() and torch.count_nonzero(adv) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo_vectorized_matches_numpy_and_the_loop_version_on_groups_of_two_or_more(seed):
    rewards, mask, index = random_batch(seed)
    scores = (rewards * mask).sum(-1)
    valid = mask.sum(-1) > 0
    expected = np_rloo_vectorized(scores, list(index), valid)[:, None] * mask
    adv, ret = compute_rloo_vectorized_outcome_advantage(t(rewards), t(mask), index)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert torch.equal(adv, ret)
    loop, _ = compute_rloo_outcome_advantage(t(rewards), t(mask), index)
    counts = {g: sum(1 for i, x in enumerate(index) if x == g and valid[i]) for g in set(index)}
    multi = np.array([counts[g] > 1 for g in index])
    np.testing.assert_allclose(adv.numpy()[multi], loop.numpy()[multi], rtol=1e-12, atol=1e-12)
    # Group "c" has one row: verl's vectorized RLOO gives 0, the loop version keeps its score.
    single = int(np.flatnonzero(index == "c")[0])
    assert torch.count_nonzero(adv[single]) == 0
    np.testing.assert_allclose(loop[single].numpy(), scores[single] * mask[single])


def test_rloo_vectorized_by_hand():
    # scores 1, 2, 6 in one group: A_i = s_i - mean(others) = 1-4, 2-3.5, 6-1.5
    adv, _ = compute_rloo_vectorized_outcome_advantage(t([[1], [2], [6]]), t([[1], [1], [1]]), [0, 0, 0])
    np.testing.assert_allclose(adv[:, 0].numpy(), [-3.0, -1.5, 4.5])


def test_empty_mask_row_leaves_its_group_and_gets_zero():
    rewards = [[1.0], [0.0], [5.0]]
    adv, _ = compute_grpo_vectorized_outcome_advantage(t(rewards), t([[1], [1], [0]]), ["g", "g", "g"])
    # the masked row's 5.0 does not enter the statistics: the other two are ±0.70711
    np.testing.assert_allclose(adv[:, 0].numpy(), [0.70711, -0.70711, 0.0], atol=1e-5)
    adv, _ = compute_rloo_vectorized_outcome_advantage(t(rewards), t([[1], [1], [0]]), ["g", "g", "g"])
    np.testing.assert_allclose(adv[:, 0].numpy(), [1.0, -1.0, 0.0])


@pytest.mark.parametrize(
    "index",
    [
        np.array(["x", "y", "x", "y"], dtype=object),
        np.array([10, 3, 10, 3]),
        [2.0, 5.0, 2.0, 5.0],
        torch.tensor([4, 1, 4, 1]),
        np.array(["x", 3, "x", 3], dtype=object),  # mixed labels: compared by identity of their text
    ],
)
def test_group_ids_of_any_kind_give_the_same_groups(index):
    codes = as_torch_index(index)
    assert codes.dtype == torch.long
    assert codes[0] == codes[2] and codes[1] == codes[3] and codes[0] != codes[1]
    adv, _ = compute_grpo_vectorized_outcome_advantage(t([[1], [2], [0], [4]]), t([[1]] * 4), index)
    np.testing.assert_allclose(adv[:, 0].numpy(), [0.70711, -0.70711, -0.70711, 0.70711], atol=1e-5)


def test_group_mean_std_singletons_and_weights():
    mean, std, count = group_mean_std(t([1.0, 3.0, 8.0, 100.0]), torch.tensor([0, 0, 1, 0]), t([1, 1, 1, 0]))
    np.testing.assert_allclose(count.numpy(), [2, 1])
    np.testing.assert_allclose(mean.numpy(), [2.0, 0.0])  # the weight-0 row is left out; singleton -> 0
    np.testing.assert_allclose(std.numpy(), [np.sqrt(2.0), 1.0])
    with pytest.raises(ValueError, match="length mismatch"):
        group_mean_std(t([1.0]), torch.tensor([0, 1]))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="uid"):
        compute_grpo_vectorized_outcome_advantage(t([[1.0]]), t([[1]]), None)
    with pytest.raises(ValueError, match="index has 1 entries but the batch has 2 rows"):
        compute_rloo_vectorized_outcome_advantage(t([[1.0], [2.0]]), t([[1], [1]]), ["a"])
    with pytest.raises(ValueError, match="response_mask"):
        compute_grpo_vectorized_outcome_advantage(t([[1.0, 2.0]]), t([[1]]), ["a"])


def test_integer_rewards_are_promoted():
    adv, _ = compute_rloo_vectorized_outcome_advantage(torch.tensor([[1], [0]]), torch.tensor([[1], [1]]), [0, 0])
    assert adv.dtype == torch.float32
    np.testing.assert_allclose(adv[:, 0].numpy(), [1.0, -1.0])


def test_registered_under_the_enum_and_the_string():
    assert get_adv_estimator_fn("grpo_vectorized") is compute_grpo_vectorized_outcome_advantage
    assert get_adv_estimator_fn(AdvantageEstimator.GRPO_VECTORIZED) is compute_grpo_vectorized_outcome_advantage
    assert get_adv_estimator_fn(AdvantageEstimator.RLOO_VECTORIZED) is compute_rloo_vectorized_outcome_advantage
    assert AdvantageEstimator("rloo_vectorized") is AdvantageEstimator.RLOO_VECTORIZED
