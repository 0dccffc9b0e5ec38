"""verl metric computations on a hand-built 3-row batch; expected values worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer import metrics as metrics_mod
from verl.trainer.metrics import (
    Timer,
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    marked_timer,
    reduce_metrics,
)

# prompt width 3 (left padded), response width 4 (right padded)
#   row 0: prompt 2 tokens, response 4 (hits the width: clipped)
#   row 1: prompt 3 tokens (hits the width), response 2
#   row 2: prompt 1 token,  response 0 (aborted)
ATTENTION = [[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0]]


def make_batch(with_response_mask: bool = True, meta_info: dict | None = None, **extra) -> DataProto:
    attention = torch.tensor(ATTENTION)
    tensors = {
        "responses": torch.zeros(3, 4, dtype=torch.long),
        "attention_mask": attention,
        # scores 1.0, 0.5 and 3.0 (row 2 aborted: excluded)
        "token_level_scores": torch.tensor([[0, 0, 0, 1.0], [0, 0.5, 0, 0], [3.0, 0, 0, 0]]),
        # rewards 0.9, 0.3 and 5.0 (excluded)
        "token_level_rewards": torch.tensor([[-0.1, 0, 0, 1.0], [0, 0.5, -0.2, 0], [5.0, 0, 0, 0]]),
        "advantages": torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]),
        "returns": torch.tensor([[0.5, 0.5, 0.5, 0.5], [1, -1, 100, 100], [7, 7, 7, 7]]),
        "values": torch.tensor([[0.5, 0.5, 0.5, 0.5], [0, 0, 50, 50], [7, 7, 7, 7]]),
        **extra,
    }
    if with_response_mask:
        tensors["response_mask"] = attention[:, 3:]
    return DataProto.from_dict(tensors=tensors, meta_info=meta_info or {})


def test_data_metrics_hand_computed() -> None:
    m = compute_data_metrics(make_batch(), use_critic=True)
    expected = {
        "critic/score/mean": 0.75,
        "critic/score/max": 1.0,
        "critic/score/min": 0.5,
        "critic/rewards/mean": 0.6,
        "critic/rewards/max": 0.9,
        "critic/rewards/min": 0.3,
        # masked advantages 1,2,3,4,5,6
        "critic/advantages/mean": 3.5,
        "critic/advantages/max": 6.0,
        "critic/advantages/min": 1.0,
        # masked returns 0.5 x4, 1, -1
        "critic/returns/mean": 1 / 3,
        "critic/returns/max": 1.0,
        "critic/returns/min": -1.0,
        # masked values 0.5 x4, 0, 0
        "critic/values/mean": 1 / 3,
        "critic/values/max": 0.5,
        "critic/values/min": 0.0,
        # R - V = 0,0,0,0,1,-1 -> unbiased var 2/5; Var(R) = (4/36 + 4/9 + 16/9) / 5 = 7/15
        "critic/vf_explained_var": 1 - 0.4 / (7 / 15 + 1e-5),
        "response_length/mean": 2.0,
        "response_length/max": 4.0,
        "response_length/min": 0.0,
        "response_length/clip_ratio": 1 / 3,
        "response_length_non_aborted/mean": 3.0,
        "response_length_non_aborted/max": 4.0,
        "response_length_non_aborted/min": 2.0,
        "response_length_non_aborted/clip_ratio": 0.5,
        "response/aborted_ratio": 1 / 3,
        "prompt_length/mean": 2.0,
        "prompt_length/max": 3.0,
        "prompt_length/min": 1.0,
        "prompt_length/clip_ratio": 1 / 3,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
        assert isinstance(m[key], float), key


def test_data_metrics_without_critic_and_default_response_mask() -> None:
    m = compute_data_metrics(make_batch(with_response_mask=False))
    assert not any(k.startswith("critic/values") or k == "critic/vf_explained_var" for k in m)
    assert m["critic/advantages/mean"] == pytest.approx(3.5)  # mask taken from attention_mask's response part


def test_response_mask_excludes_observation_tokens() -> None:
    batch = make_batch()
    batch.batch["response_mask"] = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    m = compute_data_metrics(batch)
    assert m["critic/advantages/mean"] == pytest.approx((1 + 4 + 5 + 6) / 4)
    assert m["response_length/mean"] == pytest.approx(2.0)  # lengths still come from attention_mask


def test_num_turns_metrics() -> None:
    batch = make_batch()
    batch.non_tensor_batch["__num_turns__"] = np.array([2, 4, 3])
    m = compute_data_metrics(batch)
    assert (m["num_turns/min"], m["num_turns/max"], m["num_turns/mean"]) == (2.0, 4.0, 3.0)


def test_all_rows_aborted_gives_nan_scores() -> None:
    batch = make_batch()
    batch.batch["attention_mask"][:, 3:] = 0
    batch.batch["response_mask"][:] = 0
    m = compute_data_metrics(batch)
    assert math.isnan(m["critic/score/mean"]) and math.isnan(m["critic/advantages/max"])
    assert m["response/aborted_ratio"] == 1.0


def test_missing_tensor_names_key_and_producer() -> None:
    batch = make_batch()
    batch.batch.pop("advantages")
    with pytest.raises(KeyError, match=r"batch\['advantages'\] \(produced by compute_advantage\)"):
        compute_data_metrics(batch)
    batch = make_batch()
    batch.batch.pop("values")
    with pytest.raises(KeyError, match="values"):
        compute_data_metrics(batch, use_critic=True)


def test_timing_metrics() -> None:
    timing = {"gen": 1.2, "ref": 0.6, "update_actor": 2.4, "step": 5.0, "reward": 0.1}
    m = compute_timing_metrics(make_batch(), timing)
    # 6 response tokens; 6 prompt + 6 response = 12 tokens in all
    assert m == pytest.approx(
        {
            "timing_s/gen": 1.2,
            "timing_s/ref": 0.6,
            "timing_s/update_actor": 2.4,
            "timing_s/step": 5.0,
            "timing_s/reward": 0.1,
            "timing_per_token_ms/gen": 1200 / 6,
            "timing_per_token_ms/ref": 600 / 12,
            "timing_per_token_ms/update_actor": 2400 / 12,
        }
    )


def test_throughput_metrics() -> None:
    # meta_info's per-row token counts win over attention_mask (which sums to 12)
    m = compute_throughput_metrics(make_batch(meta_info={"global_token_num": [10, 10, 4]}), {"step": 3.0}, n_gpus=2)
    assert m == {"perf/total_num_tokens": 24, "perf/time_per_step": 3.0, "perf/throughput": 4.0}
    m = compute_throughput_metrics(make_batch(), {"step": 3.0}, n_gpus=1)
    assert m["perf/total_num_tokens"] == 12 and m["perf/throughput"] == pytest.approx(4.0)
    with pytest.raises(KeyError, match="timing_raw\\['step'\\]"):
        compute_throughput_metrics(make_batch(), {"gen": 1.0}, n_gpus=1)
    with pytest.raises(ValueError, match="n_gpus"):
        compute_throughput_metrics(make_batch(), {"step": 1.0}, n_gpus=0)


def test_reduce_metrics_verl_rule() -> None:
    out = reduce_metrics(
        {
            "actor/pg_loss": [1.0, 2.0, 6.0],
            "actor/perf/max_memory_allocated_gb": [1.0, 5.0, 3.0],
            "global_seqlen/min": [4, 2, 9],
            "global_seqlen/minmax_diff": [1, 7, 3],  # "max" is checked first, as in verl
            "actor/grad_norm": [torch.tensor(2.0), np.float32(4.0)],
            "actor/lr": 1e-6,
            "critic/vf_loss": torch.tensor(0.5),
            "empty": [],
        }
    )
    assert out["actor/pg_loss"] == 3.0
    assert out["actor/perf/max_memory_allocated_gb"] == 5.0
    assert out["global_seqlen/min"] == 2.0
    assert out["global_seqlen/minmax_diff"] == 7.0
    assert out["actor/grad_norm"] == 3.0
    assert out["actor/lr"] == 1e-6 and out["critic/vf_loss"] == 0.5
    assert math.isnan(out["empty"])
    assert all(isinstance(v, float) for v in out.values())


def test_marked_timer_accumulates_and_records_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter([10.0, 12.5, 20.0, 21.0, 30.0, 30.25])
    monkeypatch.setattr(metrics_mod.time, "perf_counter", lambda: next(ticks))
    timing: dict[str, float] = {}
    with marked_timer("gen", timing) as t:
        pass
    assert t.last == 2.5
    with marked_timer("gen", timing):
        pass
    assert timing == {"gen": 3.5}
    with pytest.raises(RuntimeError), marked_timer("reward", timing):
        raise RuntimeError("scorer crashed")
    assert timing == {"gen": 3.5, "reward": 0.25}


def test_timer_total_over_uses() -> None:
    timer = Timer("x")
    for _ in range(2):
        with timer:
            sum(range(100))
    assert timer.total >= timer.last > 0
