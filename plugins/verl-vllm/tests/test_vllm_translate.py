"""Request translation helpers (no vLLM needed): hand-computed expectations."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from verl_vllm.translate import (
    collect_outputs,
    max_tokens_per_row,
    row_seeds,
    sampling_kwargs,
    strip_left_padding,
)

from verl.engines.reference.sampling import SamplingParams


def test_strip_left_padding_keeps_exact_tokens():
    ids = torch.tensor([[0, 0, 7, 8], [5, 6, 7, 8], [0, 0, 0, 9]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    assert strip_left_padding(ids, mask) == [[7, 8], [5, 6, 7, 8], [9]]


def test_row_seeds():
    assert row_seeds(3, None, None, greedy=True) == [None, None, None]
    assert row_seeds(2, torch.tensor([5, -1]), 99, greedy=False) == [5, 2**63 - 1]
    assert row_seeds(3, None, 7, greedy=False) == [7_000_021, 7_000_022, 7_000_023]
    assert row_seeds(2, None, None, greedy=False) == [None, None]
    with pytest.raises(ValueError, match=r"sample_seed must have shape \(3,\)"):
        row_seeds(3, torch.tensor([1, 2]), None, greedy=False)


def test_max_tokens_capped_by_model_length():
    assert max_tokens_per_row([3, 10, 12], 8, 20) == [8, 8, 8]
    assert max_tokens_per_row([3, 15], 8, 20) == [8, 5]
    with pytest.raises(ValueError, match="prompt row 1 has 20 tokens"):
        max_tokens_per_row([3, 20], 8, 20)


def test_sampling_kwargs_sampled_and_greedy():
    sampled = SamplingParams(do_sample=True, temperature=0.7, top_p=0.9, top_k=-1)
    kw = sampling_kwargs(sampled, max_tokens=16, stop_token_ids=[2, 66], logprobs=True, seed=11)
    assert kw == {
        "n": 1,
        "max_tokens": 16,
        "stop_token_ids": [2, 66],
        "ignore_eos": False,
        "logprobs": 0,
        "detokenize": False,
        "seed": 11,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
    }
    greedy = SamplingParams(do_sample=False, temperature=0.7, top_p=0.9, top_k=50)
    kw = sampling_kwargs(greedy, max_tokens=4, stop_token_ids=[2], logprobs=False, seed=None)
    assert kw["temperature"] == 0.0 and "top_p" not in kw and "top_k" not in kw and kw["logprobs"] is None
    top_k = sampling_kwargs(
        SamplingParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=20),
        max_tokens=4,
        stop_token_ids=[2],
        logprobs=True,
        seed=None,
    )
    assert top_k["top_k"] == 20


def _request(tokens, logps):
    logprobs = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logps, strict=True)]
    return SimpleNamespace(request_id="r", outputs=[SimpleNamespace(token_ids=tokens, logprobs=logprobs)])


def test_collect_outputs_pads_and_places_log_probs():
    outs = [_request([5, 6, 2], [-0.5, -1.0, -0.25]), _request([7, 8, 9, 10, 11], [-1.0] * 5), _request([], [])]
    responses, lengths, log_probs = collect_outputs(outs, 4, pad_token_id=3, want_log_probs=True)
    assert responses.tolist() == [[5, 6, 2, 3], [7, 8, 9, 10], [3, 3, 3, 3]]
    assert lengths.tolist() == [3, 4, 0]
    assert log_probs.tolist() == [[-0.5, -1.0, -0.25, 0.0], [-1.0] * 4, [0.0] * 4]
    _, _, none = collect_outputs(outs, 4, pad_token_id=3, want_log_probs=False)
    assert not none.any()
