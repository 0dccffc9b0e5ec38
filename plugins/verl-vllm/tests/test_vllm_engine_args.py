"""``engine_kwargs.vllm.compilation_config`` / ``kv_cache_dtype`` / ``async_scheduling`` / ``additional_config``
(issue #15): checked at load, passed to ``vllm.LLM`` under vLLM's names, refused where vLLM would override them.

The mapping tests need no vLLM; one engine build reads the values back from the running engine's own config.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
from verl_vllm.engine_args import passthrough_arguments, passthrough_problems
from verl_vllm.options import VLLMRolloutOptions
from verl_vllm.rollout_keys import check_vllm_rollout_config, device_problems

from verl.config import ConfigError, load_config

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")
KW = "actor_rollout_ref.rollout.engine_kwargs.vllm"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def _rollout(sizes=None, **vllm):
    return SimpleNamespace(engine_kwargs={"vllm": vllm}, cudagraph_capture_sizes=sizes, gpu_memory_utilization=None)


def test_mappings_take_dicts_and_json_strings_and_name_the_key_otherwise():
    opts = VLLMRolloutOptions(compilation_config='{"cudagraph_mode": "FULL_DECODE_ONLY"}', additional_config={"a": 1})
    assert opts.compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY"} and opts.additional_config == {"a": 1}
    for bad in (5, "[1, 2]", "{not json"):
        with pytest.raises(ValueError, match="engine_kwargs.vllm.compilation_config"):
            VLLMRolloutOptions(compilation_config=bad)
    with pytest.raises(ValueError, match="async_scheduling"):
        VLLMRolloutOptions(async_scheduling="yes")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        VLLMRolloutOptions(kv_cache_dtype=8)


def test_only_set_options_are_passed_and_capture_sizes_merge_into_compilation_config():
    assert passthrough_arguments(_rollout(), VLLMRolloutOptions()) == {}
    opts = VLLMRolloutOptions(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"},
        kv_cache_dtype="fp8",
        async_scheduling=True,
        additional_config={"enable_cpu_binding": True},
    )
    assert passthrough_arguments(_rollout(sizes=(4, 8)), opts) == {
        "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [4, 8]},
        "kv_cache_dtype": "fp8",
        "async_scheduling": True,
        "additional_config": {"enable_cpu_binding": True},
    }
    # The options' own mapping is not changed by the merge.
    assert opts.compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY"}


def test_capture_sizes_both_ways_is_refused_naming_both():
    rollout = _rollout(sizes=(4,), compilation_config={"cudagraph_capture_sizes": [8]})
    [(key, message)] = check_vllm_rollout_config(SimpleNamespace(**vars(rollout), load_format="auto"))
    assert key == "actor_rollout_ref.rollout.cudagraph_capture_sizes"
    assert f"{KW}.compilation_config.cudagraph_capture_sizes" in message
    json_form = _rollout(sizes=(4,), compilation_config='{"cudagraph_capture_sizes": [8]}')
    assert check_vllm_rollout_config(SimpleNamespace(**vars(json_form), load_format="auto"))


def test_what_vllm_would_override_is_refused_per_device():
    graphs = VLLMRolloutOptions(compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"}, enable_chunked_prefill=False)
    [cpu] = passthrough_problems(graphs, "cpu")
    assert "compilation_config.cudagraph_mode" in cpu and "cpu" in cpu
    assert passthrough_problems(graphs, "cuda") == []  # null enforce_eager = false on cuda
    eager = VLLMRolloutOptions(compilation_config={"mode": 3, "cudagraph_mode": "NONE"}, enforce_eager=True)
    [mode] = passthrough_problems(eager, "cuda")
    assert "compilation_config.mode" in mode and "enforce_eager" in mode
    assert passthrough_problems(VLLMRolloutOptions(compilation_config={"cudagraph_mode": "NONE"}), "cpu") == []

    fp8, other = VLLMRolloutOptions(kv_cache_dtype="fp8_e5m2"), VLLMRolloutOptions(kv_cache_dtype="fp8_inc")
    assert passthrough_problems(fp8, "cpu") == [] and passthrough_problems(other, "cuda") == []
    [kv] = passthrough_problems(other, "cpu")
    assert "kv_cache_dtype='fp8_inc'" in kv and "fp8_e4m3" in kv
    [sched] = passthrough_problems(VLLMRolloutOptions(async_scheduling=True), "cpu")
    assert "async_scheduling" in sched
    assert passthrough_problems(VLLMRolloutOptions(async_scheduling=True), "cuda") == []
    # The engine's device check includes them.
    assert any(
        "async_scheduling" in p for p in device_problems(_rollout(), VLLMRolloutOptions(async_scheduling=True), "cpu")
    )


def test_verls_script_overrides_load():
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.rollout.name=vllm",
            f"+{KW}.compilation_config.cudagraph_mode=FULL_DECODE_ONLY",
            f"+{KW}.compilation_config.cudagraph_capture_sizes=[4,12,24]",
            f"++{KW}.additional_config.enable_cpu_binding=True",
            f"++{KW}.async_scheduling=True",
            f"+{KW}.kv_cache_dtype=fp8",
        ]
    )
    vllm = cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"]
    assert vllm["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [4, 12, 24]}
    with pytest.raises(ConfigError, match="cudagraph_capture_sizes"):
        load_config(
            overrides=[
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.cudagraph_capture_sizes=[4]",
                f"+{KW}.compilation_config.cudagraph_capture_sizes=[8]",
            ]
        )


@needs_vllm
def test_engine_passes_them_to_vllm(tmp_path):
    from verl_vllm.engine import VLLMRolloutEngine

    from verl.models import load_tokenizer
    from verl.testing.conformance import make_prompt_batch, make_rollout_config, save_conformance_model

    path = save_conformance_model(tmp_path / "model", hidden_size=128)
    tok = load_tokenizer(path)
    config = make_rollout_config(
        n=1,
        dtype="float32",
        do_sample=False,
        response_length=4,
    )
    # The validated engine_kwargs.vllm, as the factory passes them.
    options = VLLMRolloutOptions(
        kv_cache_dtype="fp8",
        async_scheduling=False,
        additional_config={"verl_test_marker": 7},
        compilation_config={"custom_ops": ["+rms_norm"]},
    )
    engine = VLLMRolloutEngine(path, tok, config, device=DEVICE, options=options)
    try:
        vcfg = engine.llm.llm_engine.vllm_config
        assert vcfg.cache_config.cache_dtype == "fp8"
        assert vcfg.scheduler_config.async_scheduling is False
        assert vcfg.additional_config == {"verl_test_marker": 7}
        assert "+rms_norm" in vcfg.compilation_config.custom_ops
        out = engine.generate(make_prompt_batch(tok, ("What is 2+3?", "hi")))
        assert out.batch["responses"].shape == (2, 4)
    finally:
        engine.close()
