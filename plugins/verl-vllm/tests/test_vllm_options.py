"""Options of the ``vllm`` engine, its plugin spec, the environment it sets and its missing-backend errors.

None of these start vLLM; the config tests need the plugin installed (its entry point registers ``vllm``).
"""

from __future__ import annotations

import sys

import attrs
import pytest
from verl_vllm.backend import (
    UnsupportedDeviceError,
    VLLMNotInstalledError,
    device_type,
    engine_environment,
    import_vllm,
)
from verl_vllm.options import VLLMRolloutOptions


def test_defaults():
    opts = VLLMRolloutOptions()
    assert attrs.asdict(opts) == {
        "dtype": None,
        "enforce_eager": None,
        "kv_cache_space_gib": None,
        "omp_threads_bind": "nobind",
        "gpu_memory_utilization": 0.5,
        "max_num_seqs": 256,
        "max_model_len": None,
        "max_num_batched_tokens": None,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": None,
        "enable_sleep_mode": True,
        "sleep_level": 1,
        "seed": None,
        "compilation_config": None,
        "kv_cache_dtype": None,
        "async_scheduling": None,
        "additional_config": None,
    }


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("dtype", "int8", "engine_kwargs.vllm.dtype='int8'"),
        ("gpu_memory_utilization", 1.5, "gpu_memory_utilization must be in (0, 1]"),
        ("gpu_memory_utilization", 0, "gpu_memory_utilization must be in (0, 1]"),
        ("max_num_seqs", 0, "max_num_seqs must be a positive number"),
        ("max_model_len", 128.5, "max_model_len must be an integer"),
        ("kv_cache_space_gib", -1, "kv_cache_space_gib must be a positive number"),
        ("omp_threads_bind", "cores 0 and 1", "omp_threads_bind='cores 0 and 1'"),
        ("sleep_level", 3, "sleep_level"),
    ],
)
def test_bad_values_name_the_key(key, value, fragment):
    with pytest.raises(ValueError) as info:
        VLLMRolloutOptions(**{key: value})
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", ["auto", "nobind", "0-1", "0,1|2-3", None])
def test_thread_binding_values_accepted(value):
    assert VLLMRolloutOptions(omp_threads_bind=value).omp_threads_bind == value


def test_engine_environment_cpu_and_cuda():
    opts = VLLMRolloutOptions(kv_cache_space_gib=3, omp_threads_bind="0-1")
    assert engine_environment(opts, "cpu", environ={}) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    }
    # Null options keep what the environment says, else 1 GiB; cuda sets only the in-process switch.
    keep = VLLMRolloutOptions(omp_threads_bind=None)
    assert engine_environment(keep, "cpu", environ={"VLLM_CPU_KVCACHE_SPACE": "4"}) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"
    }
    assert engine_environment(keep, "cpu", environ={})["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert engine_environment(opts, "cuda", environ={}) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_device_types():
    import torch

    assert device_type("cpu") == "cpu"
    assert device_type("cuda:1") == "cuda"
    assert device_type(torch.device("cpu")) == "cpu"
    with pytest.raises(UnsupportedDeviceError, match=r"does not support device 'npu:0' \(supports: cpu, cuda\)"):
        device_type("npu:0")


@pytest.mark.parametrize(("device", "extra"), [("cpu", "[cpu]"), ("cuda", "[cuda]")])
def test_missing_vllm_names_the_extra(monkeypatch, device, extra):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(VLLMNotInstalledError) as info:
        import_vllm(device)
    # The packages are on no index: the hint installs the plugin folder of the checkout, with the extra.
    assert f"pip install './plugins/verl-vllm{extra}'" in str(info.value)
    assert isinstance(info.value, ImportError)


def test_missing_vllm_from_the_engine_and_the_factory(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from verl_vllm.builder import build_vllm_rollout_engine
    from verl_vllm.engine import VLLMRolloutEngine

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(VLLMNotInstalledError, match=r"pip install '\./plugins/verl-vllm\[cpu\]'"):
        VLLMRolloutEngine(tmp_path, None, SimpleNamespace(), device="cpu")
    config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace()))
    with pytest.raises(VLLMNotInstalledError, match=r"pip install '\./plugins/verl-vllm\[cuda\]'"):
        build_vllm_rollout_engine(config, model=tmp_path, options=None, device="cuda:0")
    # The device is checked before the install.
    with pytest.raises(UnsupportedDeviceError):
        build_vllm_rollout_engine(config, model=tmp_path, options=None, device="mps")


def test_live_module_is_refused():
    import torch
    from verl_vllm.engine import VLLMRolloutEngine

    with pytest.raises(TypeError, match="pass a model path, not a live module"):
        VLLMRolloutEngine(torch.nn.Linear(2, 2))


def test_plugin_registers_the_vllm_rollout_engine():
    from verl.plugins import get_plugin_manager

    spec = get_plugin_manager().get("rollout_engine", "vllm")
    assert spec.options_cls is VLLMRolloutOptions
    assert tuple(spec.devices) == ("cpu", "cuda")
    assert "share_module" not in spec.capabilities


def test_config_validates_vllm_options():
    from verl.config import ConfigError, load_config

    cfg = load_config(
        None,
        [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=64",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_space_gib=2",
        ],
    )
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    with pytest.raises(ConfigError) as info:
        load_config(
            None,
            ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_mem_util=0.3"],
        )
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_mem_util" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(
            None, ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.engine_kwargs.vllm.sleep_level=5"]
        )
    assert "sleep_level" in str(info.value)
