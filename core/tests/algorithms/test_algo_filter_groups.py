"""DAPO group filter (verl recipe/dapo/dapo_ray_trainer.py) on hand-built batches: which groups stay, the
order, the cut to train_batch_size groups, the round limit and the metric lookup."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.algorithms.filter_groups import (
    DynamicSamplingError,
    GroupFilter,
    group_metric_values,
    kept_group_uids,
)
from verl.protocol import DataProto


def scored(uids: list[str], scores: list[float], *, resp_len: int = 3, **extra: list) -> DataProto:
    """Rows with the score at the last response token (as the reward manager writes it) and extra-info columns."""
    bs = len(uids)
    token_scores = torch.zeros(bs, resp_len)
    token_scores[:, -1] = torch.tensor(scores)
    non_tensor = {"uid": np.array(uids, dtype=object)}
    non_tensor.update({f"reward_extra/{k}": np.array(v, dtype=object) for k, v in extra.items()})
    return DataProto.from_dict(
        tensors={
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores - 0.25,  # a KL penalty of 0.25 at each of the 3 tokens
            "row": torch.arange(bs),
        },
        non_tensors=non_tensor,
        meta_info={"temperature": 1.0},
    )


def test_constant_groups_are_dropped_and_groups_of_one_kept_in_first_appearance_order():
    uids = ["c", "c", "a", "a", "b", "single", "b", "d", "d", "d"]
    values = [1, 1, 0, 1, 0.5, 0.0, 0.5, 0, 0, 0.2]
    kept, dropped = kept_group_uids(uids, values)
    assert kept == ["a", "single", "d"]
    assert dropped == ["c", "b"]


def test_equal_float_scores_are_no_spread_although_np_std_is_not_zero():
    assert np.std([0.1, 0.1, 0.1]) > 0  # why the filter compares max and min instead
    assert kept_group_uids(["u"] * 3, [0.1, 0.1, 0.1]) == ([], ["u"])


def test_metric_lookup_sequence_sums_and_extra_info_keys():
    batch = scored(["a", "a"], [1.0, 0.0], acc=[True, False], pred=["7", "8"])
    np.testing.assert_array_equal(group_metric_values(batch, "seq_reward"), [1.0, 0.0])
    np.testing.assert_allclose(group_metric_values(batch, "seq_final_reward"), [1.0 - 0.75, -0.75])
    np.testing.assert_array_equal(group_metric_values(batch, "acc"), [1.0, 0.0])
    batch.non_tensor_batch["score"] = np.array([3, 4], dtype=object)  # verl's bare key is read too
    np.testing.assert_array_equal(group_metric_values(batch, "score"), [3.0, 4.0])
    assert group_metric_values(batch, "seq_reward").dtype == np.float64


def test_a_missing_metric_names_the_key_and_the_present_ones():
    batch = scored(["a", "a"], [1.0, 0.0], acc=[1.0, 0.0])
    with pytest.raises(DynamicSamplingError, match=r"algorithm.filter_groups.metric='scroe'.*\['acc'\]"):
        group_metric_values(batch, "scroe")


@pytest.mark.parametrize("bad", [None, "7", float("nan")])
def test_a_non_number_names_the_row(bad):
    batch = scored(["a", "a"], [1.0, 0.0], pred=[1.0, bad])
    with pytest.raises(DynamicSamplingError, match=r"'pred': row 1 holds .* not a finite number"):
        group_metric_values(batch, "pred")


@pytest.mark.parametrize("metric", ["seq_reward", "seq_final_reward"])
def test_a_non_finite_sequence_sum_names_the_rows(metric):
    batch = scored(["a", "a", "b"], [1.0, float("nan"), float("inf")])
    with pytest.raises(DynamicSamplingError, match=rf"'{metric}': rows \[1, 2\] sum token_level_\w+ to a non-finite"):
        group_metric_values(batch, metric)


def test_rounds_accumulate_until_enough_groups_then_cut_to_exactly_train_batch_size():
    groups = GroupFilter("seq_reward", train_batch_size=3)
    # Round 1: g1 varies, g2 constant, g3 varies -> 2 kept.
    groups.add(scored(["g1", "g1", "g2", "g2", "g3", "g3"], [0, 1, 1, 1, 0.2, 0.4]))
    assert not groups.ready
    groups.check_budget()  # no limit (0): never raises
    # Round 2: g4 constant, g5 and g6 vary -> 4 kept in all, one more than the step trains on.
    groups.add(scored(["g4", "g4", "g5", "g5", "g6", "g6"], [0, 0, 1, 0, 0, 1]))
    assert groups.ready
    batch = groups.take()
    assert list(batch.non_tensor_batch["uid"]) == ["g1", "g1", "g3", "g3", "g5", "g5"]
    # Rows arrive in the order generated: round 1's rows 0, 1, 4, 5 then round 2's rows 2, 3.
    assert batch.batch["row"].tolist() == [0, 1, 4, 5, 2, 3]
    assert batch.batch["token_level_scores"][:, -1].tolist() == pytest.approx([0, 1, 0.2, 0.4, 1, 0])
    assert batch.meta_info == {"temperature": 1.0}
    assert groups.metrics() == {
        "train/num_gen_batches": 2,
        "train/filter_groups/kept": 4,
        "train/filter_groups/dropped": 2,
        "train/filter_groups/surplus": 1,
        # Before the filter, by hand: (0 + 1 + 1 + 1 + 0.2 + 0.4 + 0 + 0 + 1 + 0 + 0 + 1) / 12; round 1: 3.6 / 6.
        "train/filter_groups/metric_mean": pytest.approx(5.6 / 12),
        "train/filter_groups/metric_mean_first_round": pytest.approx(0.6),
    }


def test_exactly_enough_groups_in_one_round_is_the_round_itself():
    groups = GroupFilter("acc", train_batch_size=2)
    groups.add(scored(["a", "a", "b", "b"], [0, 1, 1, 0], acc=[0.0, 1.0, 1.0, 0.0]))
    batch = groups.take()
    assert len(batch) == 4 and groups.metrics()["train/filter_groups/surplus"] == 0


def test_rounds_reporting_different_extra_keys_concatenate_with_none_where_missing():
    groups = GroupFilter("seq_reward", train_batch_size=2)
    groups.add(scored(["a", "a"], [0, 1], acc=[0.0, 1.0]))
    groups.add(scored(["b", "b"], [1, 0], acc=[1.0, 0.0], pred=["x", "y"]))
    batch = groups.take()
    assert list(batch.non_tensor_batch["reward_extra/pred"]) == [None, None, "x", "y"]


def test_the_round_limit_raises_verls_error_and_zero_or_negative_means_no_limit():
    constant = ["u", "u"], [1.0, 1.0]
    groups = GroupFilter("seq_reward", train_batch_size=1, max_num_gen_batches=2)
    groups.add(scored(*constant))
    groups.check_budget()  # 1 round of 2 used
    groups.add(scored(*constant))
    with pytest.raises(DynamicSamplingError) as info:
        groups.check_budget()
    message = str(info.value)
    assert "num_gen_batches=2 >= algorithm.filter_groups.max_num_gen_batches=2" in message
    assert "only 0 of data.train_batch_size=1 groups" in message and "set it to 0 for no limit" in message
    for limit in (0, -1):
        unlimited = GroupFilter("seq_reward", train_batch_size=1, max_num_gen_batches=limit)
        for _ in range(5):
            unlimited.add(scored(*constant))
            unlimited.check_budget()


def test_take_before_enough_groups_is_refused():
    groups = GroupFilter("seq_reward", train_batch_size=2)
    groups.add(scored(["a", "a"], [0.0, 1.0]))
    with pytest.raises(RuntimeError, match="needs 2 kept groups, has 1"):
        groups.take()
