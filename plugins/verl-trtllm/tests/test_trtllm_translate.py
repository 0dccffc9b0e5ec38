"""Request / response translation (no TensorRT-LLM needed): expectations written out by hand.

The outputs fed to :func:`collect_outputs` have the documented shape of TensorRT-LLM's ``RequestOutput``
(``tensorrt_llm/executor/result.py``: ``outputs[0].token_ids``, ``.logprobs`` as ``list[dict[int, Logprob]]`` or
``list[float]``, ``.finish_reason``); they are plain namespaces here.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from verl_trtllm.translate import (
    collect_outputs,
    max_tokens_per_row,
    release_tags,
    row_seeds,
    sampling_kwargs,
    sleep_config_kwargs,
    strip_left_padding,
)

from verl.engines.reference.sampling import SamplingParams

# ExecutorMemoryType values of TensorRT-LLM's 1.3 line (tensorrt_llm/_torch/virtual_memory.py), in enum order.
TAGS_13 = (
    "sampler",
    "drafter",
    "guided_decoder",
    "spec_resource_manager",
    "_no_capture_init_kv_cache",
    "_no_capture_init_extra_resources",
    "model_extra",
    "executor_extra",
    "kv_cache",
    "model",
    "draft_model",
    "model_weights",
    "draft_model_weights",
)
SAMPLED = SamplingParams(do_sample=True, temperature=0.7, top_p=0.9, top_k=-1)
GREEDY = SamplingParams(do_sample=False, temperature=0.7, top_p=0.9, top_k=50)


def test_strip_left_padding_keeps_exact_tokens():
    ids = torch.tensor([[0, 0, 7, 8], [5, 6, 7, 8], [0, 0, 0, 9]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]])
    assert strip_left_padding(ids, mask) == [[7, 8], [5, 6, 7, 8], [9]]


def test_row_seeds_per_row_call_and_engine():
    assert row_seeds(3, None, None, greedy=True, engine_seed=1, offset=0) == [None, None, None]
    assert row_seeds(2, torch.tensor([5, -1]), 99, greedy=False, engine_seed=1, offset=0) == [5, 2**63 - 1]
    assert row_seeds(3, None, 7, greedy=False, engine_seed=1, offset=50) == [7_000_021, 7_000_022, 7_000_023]
    # No seed given: rows still get distinct seeds (TensorRT-LLM's unseeded requests would all use seed 0),
    # and the next call continues where the last stopped.
    assert row_seeds(2, None, None, greedy=False, engine_seed=3, offset=0) == [3_000_009, 3_000_010]
    assert row_seeds(2, None, None, greedy=False, engine_seed=3, offset=2) == [3_000_011, 3_000_012]
    with pytest.raises(ValueError, match=r"sample_seed must have shape \(3,\)"):
        row_seeds(3, torch.tensor([1, 2]), None, greedy=False, engine_seed=0, offset=0)


def test_max_tokens_capped_by_context_and_token_budget():
    assert max_tokens_per_row([3, 10, 12], 8, 20) == [8, 8, 8]
    assert max_tokens_per_row([3, 15], 8, 20) == [8, 5]
    with pytest.raises(ValueError, match="prompt row 1 has 20 tokens"):
        max_tokens_per_row([3, 20], 8, 20)
    with pytest.raises(ValueError, match=r"prompt row 0 has 12 tokens, more than the engine's max_num_tokens \(10\)"):
        max_tokens_per_row([12], 4, 64, max_num_tokens=10)
    assert max_tokens_per_row([12], 4, 64, max_num_tokens=10, chunked_prefill=True) == [4]


def test_sampling_kwargs_trtllm_sampler_sampled():
    kw = sampling_kwargs(
        SAMPLED, max_tokens=16, eos_token_ids=[2, 66], pad_token_id=0, sampler="TRTLLMSampler", logprobs=True, seed=11
    )
    assert kw == {
        "n": 1,
        "max_tokens": 16,
        "end_id": -1,
        "pad_id": 0,
        "stop_token_ids": [2, 66],
        "include_stop_str_in_output": True,
        "ignore_eos": False,
        "detokenize": False,
        "logprobs": 1,
        "seed": 11,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
    }


def test_sampling_kwargs_torch_sampler_greedy_and_top_k():
    kw = sampling_kwargs(
        GREEDY, max_tokens=4, eos_token_ids=[2, 66], pad_token_id=0, sampler="TorchSampler", logprobs=True, seed=None
    )
    assert kw["end_id"] == 2 and kw["stop_token_ids"] == [2, 66] and kw["logprobs"] == 0
    # TensorRT-LLM's greedy: temperature 0 (params_imply_greedy_decoding); top-p/top-k left unset.
    assert kw["temperature"] == 0.0 and "top_p" not in kw and "top_k" not in kw
    top_k = sampling_kwargs(
        SamplingParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=20),
        max_tokens=4,
        eos_token_ids=[2],
        pad_token_id=0,
        sampler="TRTLLMSampler",
        logprobs=False,
        seed=3,
    )
    assert top_k["top_k"] == 20 and top_k["logprobs"] is None


def test_sampling_kwargs_ignore_eos_and_errors():
    kw = sampling_kwargs(
        SAMPLED,
        max_tokens=4,
        eos_token_ids=[2],
        pad_token_id=0,
        sampler="TorchSampler",
        logprobs=False,
        seed=1,
        ignore_eos=True,
    )
    assert kw["stop_token_ids"] == [] and kw["end_id"] == -1 and kw["ignore_eos"] is True
    with pytest.raises(ValueError, match="sampler must be"):
        sampling_kwargs(SAMPLED, max_tokens=4, eos_token_ids=[2], pad_token_id=0, sampler="x", logprobs=False, seed=1)
    with pytest.raises(ValueError, match="no EOS token id"):
        sampling_kwargs(
            SAMPLED, max_tokens=4, eos_token_ids=[], pad_token_id=0, sampler="TRTLLMSampler", logprobs=False, seed=1
        )


def _logprob(value):
    return SimpleNamespace(logprob=value, rank=1)  # tensorrt_llm.executor.result.Logprob(logprob, rank)


def _request(tokens, logprobs, finish_reason="stop"):
    completion = SimpleNamespace(token_ids=tokens, logprobs=logprobs, finish_reason=finish_reason)
    return SimpleNamespace(outputs=[completion])


def test_collect_outputs_token_logprob_dicts_and_floats():
    # Row 0: dicts with only the generated token (TRTLLMSampler, logprobs=1); row 1: dicts with the sampled token
    # and a more likely one (vLLM-style "sampled + top-1"); row 2: plain floats; row 3: nothing generated.
    outs = [
        _request([5, 6, 2], [{5: _logprob(-0.5)}, {6: _logprob(-1.0)}, {2: _logprob(-0.25)}]),
        _request(
            [7, 8, 9, 10, 11],
            [{7: _logprob(-2.0), 1: _logprob(-0.1)}] + [{t: _logprob(-1.0)} for t in (8, 9, 10, 11)],
            "length",
        ),
        _request([4], [-0.75]),
        _request([], []),
    ]
    responses, lengths, log_probs = collect_outputs(outs, 4, pad_token_id=3, want_log_probs=True)
    assert responses.tolist() == [[5, 6, 2, 3], [7, 8, 9, 10], [4, 3, 3, 3], [3, 3, 3, 3]]
    assert lengths.tolist() == [3, 4, 1, 0]
    assert log_probs.tolist() == [[-0.5, -1.0, -0.25, 0.0], [-2.0, -1.0, -1.0, -1.0], [-0.75, 0, 0, 0], [0.0] * 4]
    assert responses.dtype == torch.long and log_probs.dtype == torch.float32


def test_collect_outputs_errors():
    with pytest.raises(RuntimeError, match="not of the generated token 6"):
        collect_outputs([_request([6], [{1: _logprob(-0.1)}])], 4, 0, want_log_probs=True)
    with pytest.raises(RuntimeError, match="returned 1 log-probs for the 2 tokens of row 0"):
        collect_outputs([_request([6, 7], [-0.1])], 4, 0, want_log_probs=True)
    with pytest.raises(RuntimeError, match="did not finish"):
        collect_outputs([_request([6], [-0.1], "cancelled")], 4, 0, want_log_probs=False)
    with pytest.raises(RuntimeError, match="no completion for row 0"):
        collect_outputs([SimpleNamespace(outputs=[])], 4, 0, want_log_probs=False)
    # Log-probs not asked for: a missing logprobs list is fine.
    responses, _, log_probs = collect_outputs([_request([6], None)], 2, 0, want_log_probs=False)
    assert responses.tolist() == [[6, 0]] and log_probs.tolist() == [[0.0, 0.0]]


def test_release_tags_follow_verl():
    # verl's ServerAdapter._WEIGHTS_TAGS: every tag but kv_cache and the internal "_" ones, in enum order.
    assert release_tags(TAGS_13, "weights") == [
        "sampler",
        "drafter",
        "guided_decoder",
        "spec_resource_manager",
        "model_extra",
        "executor_extra",
        "model",
        "draft_model",
        "model_weights",
        "draft_model_weights",
    ]
    assert release_tags(TAGS_13, "kv_cache") == ["kv_cache"]
    with pytest.raises(ValueError, match="wake_up tags must be among"):
        release_tags(TAGS_13, "cuda_graph")
    with pytest.raises(ValueError, match="have no 'kv_cache'"):
        release_tags(("model",), "weights")


def test_sleep_config_levels():
    assert sleep_config_kwargs(1, TAGS_13) == {"restore_modes": {"kv_cache": "NONE"}}
    assert sleep_config_kwargs(2, TAGS_13) == {"restore_modes": {"kv_cache": "NONE", "model_weights": "NONE"}}
    # A version whose weights live under "model" (no model_weights tag).
    assert sleep_config_kwargs(2, ("kv_cache", "model")) == {"restore_modes": {"kv_cache": "NONE", "model": "NONE"}}
    with pytest.raises(ValueError, match="sleep_level must be 1 or 2"):
        sleep_config_kwargs(3, TAGS_13)
