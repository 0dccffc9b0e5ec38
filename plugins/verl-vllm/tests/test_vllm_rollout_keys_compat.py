"""verl's ``rollout.disable_log_stats`` and ``rollout.cudagraph_capture_sizes`` as vLLM engine arguments."""

from __future__ import annotations

from types import SimpleNamespace

from verl_vllm.engine_args import passthrough_arguments
from verl_vllm.options import VLLMRolloutOptions
from verl_vllm.rollout_keys import device_problems, engine_arguments


def test_engine_arguments_as_verls_vllm_server_passes_them() -> None:
    # The engine merges both dicts in this order; capture sizes reach vLLM only through compilation_config.
    rollout = SimpleNamespace(disable_log_stats=False, cudagraph_capture_sizes=(8, 16, 32))
    assert {**engine_arguments(rollout), **passthrough_arguments(rollout, VLLMRolloutOptions())} == {
        "disable_log_stats": False,
        "compilation_config": {"cudagraph_capture_sizes": [8, 16, 32]},
    }
    assert engine_arguments(rollout) == {"disable_log_stats": False}
    plain = SimpleNamespace(disable_log_stats=True, cudagraph_capture_sizes=None)
    assert {**engine_arguments(plain), **passthrough_arguments(plain, VLLMRolloutOptions())} == {
        "disable_log_stats": True
    }


def test_cudagraph_sizes_are_refused_on_cpu_only() -> None:
    rollout = SimpleNamespace(gpu_memory_utilization=None, cudagraph_capture_sizes=(8,))
    options = VLLMRolloutOptions(enable_chunked_prefill=False)
    assert any("cudagraph_capture_sizes" in p for p in device_problems(rollout, options, "cpu"))
    assert device_problems(rollout, options, "cuda") == []
