"""Options, the llm_args snapshot, the spec, config validation and the ``LLM`` keyword arguments (no TensorRT-LLM)."""

from __future__ import annotations

import importlib.util

import pytest
from verl_trtllm import llm_args_snapshot
from verl_trtllm.engine_args import EXTENSION_QUALNAME, llm_kwargs, merged_model_kwargs, resolve_dtype_name
from verl_trtllm.options import PASSTHROUGH, REFUSED, REFUSED_NESTED, TRTLLMRolloutOptions
from verl_trtllm.rollout_keys import check_trtllm_rollout_config

from verl.config import ConfigError, load_config

BASE = ["actor_rollout_ref.rollout.name=trtllm", "trainer.device=cuda"]
KW = "actor_rollout_ref.rollout.engine_kwargs.trtllm"
TAGS = ("kv_cache", "model", "model_weights")


def _cfg(*overrides):
    return load_config(None, [*BASE, *overrides])


def test_defaults_and_every_snapshot_name_is_a_field():
    opts = TRTLLMRolloutOptions()
    assert (opts.dtype, opts.enable_sleep_mode, opts.sleep_level, opts.sampler_type) == (None, True, 1, None)
    import attrs

    names = {f.name for f in attrs.fields(TRTLLMRolloutOptions)}
    # Every LLM argument of the snapshot is accepted by name (own, pass-through or refused with a reason).
    assert set(llm_args_snapshot.LLM_ARGS_FIELDS) <= names
    assert names - set(llm_args_snapshot.LLM_ARGS_FIELDS) == {"enable_sleep_mode", "sleep_level"}
    assert set(PASSTHROUGH).isdisjoint(REFUSED)
    assert "disable_overlap_scheduler" in PASSTHROUGH and "model" in REFUSED


def test_snapshot_holds_the_transcribed_fields():
    assert len(llm_args_snapshot.BASE_LLM_ARGS_FIELDS) == len(set(llm_args_snapshot.BASE_LLM_ARGS_FIELDS)) == 52
    assert len(llm_args_snapshot.TORCH_LLM_ARGS_FIELDS) == len(set(llm_args_snapshot.TORCH_LLM_ARGS_FIELDS)) == 34
    assert set(llm_args_snapshot.BASE_LLM_ARGS_FIELDS).isdisjoint(llm_args_snapshot.TORCH_LLM_ARGS_FIELDS)
    assert {"kv_cache_config", "max_num_tokens", "orchestrator_type"} <= set(llm_args_snapshot.BASE_LLM_ARGS_FIELDS)
    assert {"cuda_graph_config", "sampler_type", "ray_worker_extension_cls"} <= set(
        llm_args_snapshot.TORCH_LLM_ARGS_FIELDS
    )
    assert "sleep_config" in llm_args_snapshot.LLM_ARGS_FIELDS
    diff = llm_args_snapshot.compare(("model", "new_knob"), ("model", "old_knob"))
    assert diff == {"only_installed": ["new_knob"], "only_snapshot": ["old_knob"]}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"max_batch_size": 8},
            f"{KW}.max_batch_size is not accepted: set from actor_rollout_ref.rollout.max_num_seqs",
        ),
        ({"orchestrator_type": "rpc"}, "always 'ray'"),
        ({"tokenizer": "/x"}, "token-in/token-out"),
        ({"sleep_config": {}}, "enable_sleep_mode and sleep_level"),
        ({"kv_cache_config": {"free_gpu_memory_fraction": 0.2}}, "gpu_memory_utilization"),
        ({"cuda_graph_config": {"batch_sizes": [1, 2]}}, "cudagraph_capture_sizes"),
        ({"kv_cache_config": "{not json"}, "is not a JSON object"),
        ({"model_kwargs": 3}, "must be a mapping"),
        ({"sleep_level": 3}, "sleep_level=3 is not one of [1, 2]"),
        ({"sleep_level": True}, "is not one of [1, 2]"),
        ({"sampler_type": "torch"}, "sampler_type='torch'"),
        ({"dtype": "fp8"}, "dtype='fp8'"),
        ({"enable_sleep_mode": "yes"}, "must be true or false"),
    ],
)
def test_bad_values_name_the_key(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        TRTLLMRolloutOptions(**kwargs)
    assert fragment in str(info.value)


def test_mappings_accept_json_strings():
    opts = TRTLLMRolloutOptions(kv_cache_config='{"dtype": "fp8"}', cuda_graph_config={"enable_padding": False})
    assert opts.kv_cache_config == {"dtype": "fp8"} and opts.cuda_graph_config == {"enable_padding": False}
    assert REFUSED_NESTED["kv_cache_config"].keys() == {"free_gpu_memory_fraction", "enable_block_reuse"}


def test_config_load_checks_the_options(pretend_trtllm_installed):
    cfg = _cfg(f"{KW}.disable_overlap_scheduler=true", f"{KW}.sleep_level=2")
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["trtllm"]["sleep_level"] == 2
    with pytest.raises(ConfigError) as info:
        _cfg(f"{KW}.max_batch_sise=3")
    assert f"{KW}.max_batch_sise" in str(info.value) and f"{KW}.max_batch_size" in str(info.value)
    with pytest.raises(ConfigError, match="set from actor_rollout_ref.rollout.max_num_seqs"):
        _cfg(f"{KW}.max_batch_size=3")


def test_config_load_refuses_what_trtllm_cannot_do(pretend_trtllm_installed):
    with pytest.raises(ConfigError, match="does not declare tensor parallelism"):
        _cfg("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2")
    with pytest.raises(ConfigError, match="without CUDA graphs"):
        _cfg("actor_rollout_ref.rollout.enforce_eager=true", "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2]")
    with pytest.raises(ConfigError, match="refuses a prompt longer than it without chunked prefill"):
        _cfg("actor_rollout_ref.rollout.max_num_batched_tokens=128", "data.max_prompt_length=256")
    # With chunked prefill the same budget is fine.
    _cfg(
        "actor_rollout_ref.rollout.max_num_batched_tokens=128",
        "data.max_prompt_length=256",
        "actor_rollout_ref.rollout.enable_chunked_prefill=true",
    )
    with pytest.raises(ConfigError, match=r"does not run on platform .cpu. \(supports: cuda\)"):
        load_config(None, ["actor_rollout_ref.rollout.name=trtllm", "trainer.device=cpu"])


def test_check_config_on_a_rollout_section(pretend_trtllm_installed):
    rollout = _cfg("actor_rollout_ref.rollout.enforce_eager=true").actor_rollout_ref.rollout
    assert check_trtllm_rollout_config(rollout) == []
    import attrs

    eager_with_graphs = attrs.evolve(rollout, engine_kwargs={"trtllm": {"cuda_graph_config": {"enable_padding": True}}})
    assert [k for k, _ in check_trtllm_rollout_config(eager_with_graphs)] == [f"{KW}.cuda_graph_config"]


def test_a_ray_or_multi_worker_run_is_refused_at_config_load(pretend_trtllm_installed):
    # check_config takes root= (plugin API 2.3): the placement the engine cannot run in fails before anything loads.
    for override in ("trainer.controller=ray", "trainer.n_gpus_per_node=2"):
        with pytest.raises(ConfigError) as info:
            _cfg(override)
        # (With 2 workers the reference training engine is refused too, where verl-fsdp is not installed.)
        (issue,) = [i for i in info.value.issues if i.key == "trainer.controller"]
        assert "trainer.controller=local with one GPU" in issue.message


def test_available_never_imports_and_names_the_install(monkeypatch):
    from verl_trtllm.plugin import INSTALL_COMMAND, trtllm_available

    seen = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: seen.append(name))
    answer = trtllm_available()
    assert seen == ["tensorrt_llm"]
    assert isinstance(answer, str) and INSTALL_COMMAND in answer and "https://pypi.nvidia.com" in answer
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: object())
    assert trtllm_available() is True


def test_spec_is_registered():
    from verl.plugins import get_plugin_manager

    spec = get_plugin_manager().get("rollout_engine", "trtllm")
    assert spec.options_cls is TRTLLMRolloutOptions
    assert tuple(spec.devices) == ("cuda",)
    assert "tensor_parallel" not in spec.capabilities and "share_module" not in spec.capabilities


def test_llm_kwargs_from_rollout_keys_and_options(pretend_trtllm_installed):
    rollout = _cfg(
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.enable_prefix_caching=false",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "actor_rollout_ref.rollout.max_num_batched_tokens=4096",
        "actor_rollout_ref.rollout.enable_chunked_prefill=true",
        "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2,4]",
        "actor_rollout_ref.rollout.disable_log_stats=false",
    ).actor_rollout_ref.rollout
    opts = TRTLLMRolloutOptions(
        kv_cache_config={"dtype": "fp8"}, disable_overlap_scheduler=True, sleep_level=2, sampler_type="TorchSampler"
    )
    kwargs = llm_kwargs(
        model_path="/m",
        rollout=rollout,
        options=opts,
        max_seq_len=1024,
        dtype="bfloat16",
        trust_remote_code=True,
        model_overrides={"rope_theta": 5.0},
        memory_tags=TAGS,
        sampler="TorchSampler",
    )
    assert kwargs == {
        "model": "/m",
        "backend": "pytorch",
        "orchestrator_type": "ray",
        "ray_worker_extension_cls": EXTENSION_QUALNAME,
        "skip_tokenizer_init": True,
        "trust_remote_code": True,
        "tensor_parallel_size": 1,
        "dtype": "bfloat16",
        "max_seq_len": 1024,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.3, "enable_block_reuse": False, "dtype": "fp8"},
        "load_format": "auto",
        "sampler_type": "TorchSampler",
        "print_iter_log": True,
        "max_batch_size": 64,
        "max_num_tokens": 4096,
        "enable_chunked_prefill": True,
        "cuda_graph_config": {"enable_padding": True, "batch_sizes": [1, 2, 4]},
        "sleep_config": {"restore_modes": {"kv_cache": "NONE", "model_weights": "NONE"}},
        "model_kwargs": {"rope_theta": 5.0},
        "disable_overlap_scheduler": True,
    }
    assert EXTENSION_QUALNAME == "verl_trtllm.worker_extension.VerlWorkerExtension"


def test_llm_kwargs_defaults_eager_and_no_sleep(pretend_trtllm_installed):
    rollout = _cfg("actor_rollout_ref.rollout.enforce_eager=true").actor_rollout_ref.rollout
    kwargs = llm_kwargs(
        model_path="/m",
        rollout=rollout,
        options=TRTLLMRolloutOptions(enable_sleep_mode=False),
        max_seq_len=640,
        dtype="bfloat16",
        trust_remote_code=False,
        model_overrides={},
        memory_tags=TAGS,
    )
    # Null rollout keys leave TensorRT-LLM's defaults, except the KV-cache share (0.5, verl's value).
    assert kwargs["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5}
    assert kwargs["cuda_graph_config"] is None and "sleep_config" not in kwargs and "model_kwargs" not in kwargs
    assert not {"max_batch_size", "max_num_tokens", "enable_chunked_prefill"} & set(kwargs)
    assert kwargs["print_iter_log"] is False and kwargs["sampler_type"] == "TRTLLMSampler"


def test_dtype_and_model_kwargs_rules():
    from types import SimpleNamespace

    opts = TRTLLMRolloutOptions()
    assert resolve_dtype_name(opts, SimpleNamespace(dtype="auto")) == "bfloat16"
    assert resolve_dtype_name(opts, SimpleNamespace(dtype="fp32")) == "float32"
    assert resolve_dtype_name(TRTLLMRolloutOptions(dtype="float16"), SimpleNamespace(dtype="bf16")) == "float16"
    assert merged_model_kwargs({}, opts) is None
    assert merged_model_kwargs({"a": 1}, TRTLLMRolloutOptions(model_kwargs={"b": 2})) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="override_config.a is also set as .*model_kwargs.a"):
        merged_model_kwargs({"a": 1}, TRTLLMRolloutOptions(model_kwargs={"a": 2}))


def test_factory_refuses_placement_device_and_missing_trtllm(pretend_trtllm_installed, monkeypatch):
    import attrs
    from verl_trtllm.backend import TRTLLMNotInstalledError, UnsupportedDeviceError
    from verl_trtllm.builder import build_trtllm_rollout_engine

    cfg = _cfg()
    ray_cfg = attrs.evolve(cfg, trainer=attrs.evolve(cfg.trainer, controller="ray"))
    with pytest.raises(ValueError, match="controller='ray' and 1 workers"):
        build_trtllm_rollout_engine(ray_cfg, model="/m", options=None, device="cuda")
    with pytest.raises(UnsupportedDeviceError, match="NVIDIA GPUs only"):
        build_trtllm_rollout_engine(cfg, model="/m", options=None, device="cpu")
    import builtins

    real_import = builtins.__import__

    def no_trtllm(name, *args, **kwargs):
        if name == "tensorrt_llm" or name.startswith("tensorrt_llm."):
            raise ImportError("No module named 'tensorrt_llm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_trtllm)
    with pytest.raises(TRTLLMNotInstalledError, match="https://pypi.nvidia.com"):
        build_trtllm_rollout_engine(cfg, model="/m", options=None, device="cuda:0")


def test_sampler_follows_the_installed_release():
    from verl_trtllm.engine_args import resolve_sampler

    with_field, without = frozenset({"sampler_type", "model"}), frozenset({"model"})
    assert resolve_sampler(None, with_field) == ("TRTLLMSampler", True)  # verl's choice where it exists
    assert resolve_sampler("TorchSampler", with_field) == ("TorchSampler", True)
    assert resolve_sampler(None, None) == ("TRTLLMSampler", True)  # field list unknown: pass it
    # A release that removed sampler_type: TorchSampler, nothing passed; asking for TRTLLMSampler is an error.
    assert resolve_sampler(None, without) == ("TorchSampler", False)
    assert resolve_sampler("TorchSampler", without) == ("TorchSampler", False)
    with pytest.raises(ValueError, match="sampler_type=TRTLLMSampler: the installed TensorRT-LLM has no sampler_type"):
        resolve_sampler("TRTLLMSampler", without)
