"""Request / output translation of the ``sglang`` engine (no SGLang import): padding, seeds, caps, sampling dicts,
outputs in the shape SGLang's ``Engine.generate`` documents, and the sleep / wake tags."""

from __future__ import annotations

import pytest
import torch
from verl_sglang.translate import (
    RELEASE_TAGS,
    collect_outputs,
    max_new_tokens_per_row,
    row_seeds,
    sampling_params,
    strip_left_padding,
    wake_tags,
)

from verl.engines.reference.sampling import SamplingParams


def test_strip_left_padding_keeps_exactly_the_masked_tokens():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert strip_left_padding(ids, mask) == [[5, 6], [7, 8, 9, 10]]


def test_row_seeds_per_row_call_and_greedy():
    assert row_seeds(2, torch.tensor([3, -1]), 9, greedy=False) == [3, (1 << 63) - 1]
    assert row_seeds(3, None, 2, greedy=False) == [2_000_006, 2_000_007, 2_000_008]
    assert row_seeds(2, torch.tensor([3, 4]), 9, greedy=True) == [None, None]
    assert row_seeds(2, None, None, greedy=False) == [None, None]
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        row_seeds(2, torch.tensor([1, 2, 3]), None, greedy=False)


def test_caps_leave_sglangs_two_free_positions():
    # context 50: SGLang lets a 30-token prompt produce 50 - 2 - 30 = 18 tokens.
    assert max_new_tokens_per_row([30, 40, 10], 16, 50) == [16, 8, 16]
    # SGLang's scheduler aborts prompts of max_req_input_len = (50 - 1) - 5 = 44 tokens or more.
    longest = (50 - 1) - 5 - 1
    assert max_new_tokens_per_row([longest], 16, 50) == [50 - 2 - longest]
    with pytest.raises(ValueError, match=f"row 1 has {longest + 1} tokens"):
        max_new_tokens_per_row([3, longest + 1], 16, 50)


def _params(**kw):
    values = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20}
    values.update(kw)
    return SamplingParams(**values)


def test_sampling_params_sampled_greedy_top_k_off_and_ignore_eos():
    sampled = sampling_params(_params(), max_new_tokens=12, stop_token_ids=[2, 9], seed=4)
    assert sampled == {
        "n": 1,
        "max_new_tokens": 12,
        "stop_token_ids": [2, 9],
        "ignore_eos": False,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "sampling_seed": 4,
    }
    # SGLang refuses top_k=0; verl's off values (-1, 0) become SGLang's -1 (the whole vocabulary).
    assert sampling_params(_params(top_k=0), max_new_tokens=1, stop_token_ids=[2], seed=None)["top_k"] == -1
    greedy = sampling_params(_params(do_sample=False), max_new_tokens=3, stop_token_ids=[2], seed=None)
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"], "sampling_seed" in greedy) == (0.0, 1.0, -1, False)
    free = sampling_params(_params(), max_new_tokens=3, stop_token_ids=[2], seed=None, ignore_eos=True)
    assert (free["ignore_eos"], free["stop_token_ids"]) == (True, [])


def _out(tokens, logprobs=None, kind="stop", message=None):
    meta = {"finish_reason": {"type": kind, **({"message": message} if message else {})}}
    if logprobs is not None:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(logprobs, tokens, strict=False)]
    return {"output_ids": tokens, "meta_info": meta}


def test_collect_outputs_pads_truncates_and_places_log_probs():
    outputs = [_out([5, 6, 2], [-0.1, -0.2, -0.3]), _out([7, 8, 9, 10, 11], [-1.0, -2.0, -3.0, -4.0, -5.0], "length")]
    responses, lengths, log_probs = collect_outputs(outputs, 4, pad_token_id=0, want_log_probs=True)
    assert responses.tolist() == [[5, 6, 2, 0], [7, 8, 9, 10]]
    assert lengths.tolist() == [3, 4]
    assert log_probs.dtype == torch.float32 and responses.dtype == torch.int64
    assert torch.allclose(log_probs, torch.tensor([[-0.1, -0.2, -0.3, 0.0], [-1.0, -2.0, -3.0, -4.0]]))
    empty = collect_outputs([_out([])], 3, pad_token_id=1, want_log_probs=False)
    assert empty[0].tolist() == [[1, 1, 1]] and empty[1].tolist() == [0] and not empty[2].any()


def test_collect_outputs_errors_name_the_row():
    with pytest.raises(RuntimeError, match="aborted the request of row 0: too long"):
        collect_outputs([_out([], kind="abort", message="too long")], 4, 0, False)
    with pytest.raises(RuntimeError, match="returned none output_token_logprobs for the 2 tokens of row 0"):
        collect_outputs([_out([5, 6])], 4, 0, True)
    with pytest.raises(RuntimeError, match="1 output_token_logprobs for the 2 tokens of row 0"):
        collect_outputs([_out([5, 6], [-0.5])], 4, 0, True)
    wrong = _out([5, 6], [-0.5, -0.5])
    wrong["meta_info"]["output_token_logprobs"][1] = (-0.5, 7, None)
    with pytest.raises(RuntimeError, match="other tokens"):
        collect_outputs([wrong], 4, 0, True)


def test_release_and_wake_tags_follow_verls_order():
    assert RELEASE_TAGS == ("kv_cache", "weights")
    released = ["kv_cache", "weights"]
    assert wake_tags(["weights"], released) == ["weights"]
    assert wake_tags(["kv_cache"], ["kv_cache"]) == ["kv_cache"]
    assert wake_tags(None, released) == ["weights", "kv_cache"]
    assert wake_tags(["kv_cache"], []) == []  # never resume what is not released
    with pytest.raises(ValueError, match="cuda_graph"):
        wake_tags(["cuda_graph"], released)
