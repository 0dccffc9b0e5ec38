"""verl's first-class rollout keys reach vLLM (issue #15): ``rollout.max_num_seqs=3`` is vLLM's ``max_num_seqs``.

The mapping tests need no vLLM; one engine build checks the values inside the running ``vllm.LLM`` (its own
scheduler/load/model configs, not our options object) and ``ignore_eos`` on generated tokens.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
import torch
from verl_vllm.options import VLLMRolloutOptions
from verl_vllm.rollout_keys import (
    check_vllm_rollout_config,
    device_problems,
    load_format,
    options_from_rollout,
)
from verl_vllm.translate import sampling_kwargs

from verl.testing.conformance import make_prompt_batch, make_rollout_config, save_conformance_model

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")
R = "actor_rollout_ref.rollout"


def _rollout(**kw):
    values = {"engine_kwargs": {}, "load_format": "auto", "gpu_memory_utilization": None}
    values.update({k: None for k in ("enforce_eager", "enable_chunked_prefill", "enable_prefix_caching")})
    values.update({k: None for k in ("max_num_batched_tokens", "max_model_len", "max_num_seqs")})
    values.update(kw)
    return SimpleNamespace(**values)


def test_rollout_keys_override_the_option_defaults_and_null_keeps_engine_kwargs() -> None:
    # The validated engine_kwargs.vllm come in as the options instance; the rollout keys lie over it.
    given = VLLMRolloutOptions(max_num_batched_tokens=512, max_num_seqs=8)
    opts = options_from_rollout(_rollout(gpu_memory_utilization=0.7, max_num_seqs=3), given)
    assert (opts.gpu_memory_utilization, opts.max_num_seqs, opts.max_num_batched_tokens) == (0.7, 3, 512)
    assert options_from_rollout(_rollout()).max_num_seqs == 256  # VLLMRolloutOptions' default
    # The engine never reads the section's engine_kwargs (config load validated them into `given`).
    ignored = _rollout(engine_kwargs={"vllm": {"max_num_seqs": 5}})
    assert options_from_rollout(ignored, given).max_num_seqs == 8
    with pytest.raises(TypeError, match="options must be a VLLMRolloutOptions"):
        options_from_rollout(_rollout(), {"max_num_seqs": 5})


def test_same_key_both_ways_is_refused_naming_both() -> None:
    rollout = _rollout(enforce_eager=True, engine_kwargs={"vllm": {"enforce_eager": False}})
    [(key, message)] = check_vllm_rollout_config(rollout)  # the spec's check_config, run at config load
    assert key == f"{R}.enforce_eager" and f"{R}.engine_kwargs.vllm.enforce_eager" in message


def test_load_format_and_device_rules() -> None:
    assert [load_format(_rollout(load_format=f)) for f in ("auto", "hf", "safetensors")] == [
        "auto",
        "auto",
        "safetensors",
    ]
    rollout = _rollout(gpu_memory_utilization=0.5, enable_chunked_prefill=True)
    cpu = device_problems(rollout, options_from_rollout(rollout), "cpu")
    assert len(cpu) == 2 and "kv_cache_space_gib" in cpu[0] and "set_offset" in cpu[1]
    assert device_problems(rollout, options_from_rollout(rollout), "cuda") == []


def test_ignore_eos_drops_the_stop_tokens() -> None:
    params = SimpleNamespace(greedy=True, temperature=1.0, top_p=1.0, top_k=-1)
    kw = sampling_kwargs(params, max_tokens=4, stop_token_ids=[2], logprobs=False, seed=None, ignore_eos=True)
    assert kw["ignore_eos"] is True and kw["stop_token_ids"] == []


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_engine_builds_vllm_with_the_rollout_keys(tmp_path) -> None:
    from verl_vllm.engine import VLLMRolloutEngine

    from verl.models import load_tokenizer

    path = save_conformance_model(tmp_path / "model", hidden_size=128)
    tok = load_tokenizer(path)
    config = make_rollout_config(
        n=1,
        dtype="float32",
        do_sample=False,
        response_length=12,
        max_num_seqs=3,
        max_num_batched_tokens=256,
        max_model_len=200,
        enforce_eager=True,
        enable_prefix_caching=False,
        load_format="safetensors",
        ignore_eos=True,
        engine_kwargs={},
    )
    engine = VLLMRolloutEngine(path, tok, config, device=DEVICE)
    try:
        vcfg = engine.llm.llm_engine.vllm_config
        assert vcfg.scheduler_config.max_num_seqs == 3
        assert vcfg.scheduler_config.max_num_batched_tokens == 256
        assert vcfg.model_config.max_model_len == 200
        assert vcfg.model_config.enforce_eager is True
        assert vcfg.cache_config.enable_prefix_caching is False
        assert vcfg.load_config.load_format == "safetensors"
        out = engine.generate(make_prompt_batch(tok, ("What is 2+3?", "hi", "Count: 1 2 3", "x y z")))
        # ignore_eos: every row runs to response_length, even rows that emitted an EOS id on the way.
        assert out.batch["response_mask"].sum(dim=1).tolist() == [12] * 4
        assert torch.equal(out.batch["response_mask"], torch.ones(4, 12, dtype=out.batch["response_mask"].dtype))
    finally:
        engine.close()
