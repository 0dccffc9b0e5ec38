"""``sglang.Engine(**server_args)`` from verl's config (no SGLang import): rollout keys, context length, the
attention default, required fields, and the spec's ``check_config``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from verl_sglang.options import SGLangRolloutOptions
from verl_sglang.rollout_keys import check_config, load_format, rollout_server_args
from verl_sglang.server_args import (
    ModelTooLongError,
    attention_backend,
    build_server_args,
    context_length,
    engine_dtype,
    model_context_length,
)
from verl_sglang.server_args_fields import server_args_fields

R = "actor_rollout_ref.rollout"
FIELDS = frozenset(server_args_fields().names)


def _rollout(**kw):
    values = {
        "engine_kwargs": {},
        "load_format": "auto",
        "gpu_memory_utilization": None,
        "enforce_eager": None,
        "enable_chunked_prefill": None,
        "enable_prefix_caching": None,
        "max_num_batched_tokens": None,
        "max_model_len": None,
        "max_num_seqs": None,
        "cudagraph_capture_sizes": None,
        "disable_log_stats": True,
        "seed": 42,
        "dtype": "auto",
        "prompt_length": 32,
        "response_length": 16,
    }
    values.update(kw)
    return SimpleNamespace(**values)


def test_rollout_keys_map_to_server_args():
    args = rollout_server_args(
        _rollout(
            gpu_memory_utilization=0.7,
            enforce_eager=True,
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            enable_prefix_caching=False,
            enable_chunked_prefill=False,
            load_format="hf",
            seed=3,
        ),
        FIELDS,
    )
    assert args == {
        "mem_fraction_static": 0.7,
        "load_format": "auto",
        "random_seed": 3,
        "disable_cuda_graph": True,
        "max_running_requests": 8,
        "max_prefill_tokens": 4096,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
    }
    # Null keys keep SGLang's defaults; memory keeps verl's 0.5.
    assert rollout_server_args(_rollout(), FIELDS) == {
        "mem_fraction_static": 0.5,
        "load_format": "auto",
        "random_seed": 42,
    }


def test_cuda_graph_sizes_follow_the_installed_field_name():
    sizes = _rollout(cudagraph_capture_sizes=(1, 2, 4))
    assert rollout_server_args(sizes, {"cuda_graph_bs_decode"})["cuda_graph_bs_decode"] == [1, 2, 4]  # 0.5.2x
    assert rollout_server_args(sizes, {"cuda_graph_bs"})["cuda_graph_bs"] == [1, 2, 4]  # 0.5.8
    with pytest.raises(ValueError, match="neither cuda_graph_bs"):
        rollout_server_args(sizes, set())


def test_check_config_refuses_what_sglang_cannot_honour():
    assert check_config(_rollout()) == []
    problems = dict(
        check_config(
            _rollout(
                disable_log_stats=False,
                load_format="dummy",
                enforce_eager=True,
                cudagraph_capture_sizes=(1,),
                enable_chunked_prefill=False,
                engine_kwargs={"sglang": {"chunked_prefill_size": 512}},
            )
        )
    )
    assert set(problems) == {
        f"{R}.disable_log_stats",
        f"{R}.load_format",
        f"{R}.cudagraph_capture_sizes",
        f"{R}.enable_chunked_prefill",
    }
    assert "log_level=info" in problems[f"{R}.disable_log_stats"]
    # SGLang's cuda_graph_* fields would switch CUDA graphs back on after enforce_eager's disable_cuda_graph.
    eager = _rollout(
        enforce_eager=True, engine_kwargs={"sglang": {"cuda_graph_config": {"a": 1}, "cuda_graph_bs": None}}
    )
    ((key, message),) = check_config(eager)
    assert key == f"{R}.engine_kwargs.sglang.cuda_graph_config" and "enforce_eager=true" in message
    assert check_config(_rollout(enforce_eager=False, engine_kwargs={"sglang": {"cuda_graph_config": {"a": 1}}})) == []
    # A null chunk size is SGLang's default, no conflict with chunked prefill off.
    unset = _rollout(enable_chunked_prefill=False, engine_kwargs={"sglang": {"chunked_prefill_size": None}})
    assert check_config(unset) == []
    with pytest.raises(ValueError, match="'dummy'"):
        load_format(_rollout(load_format="dummy"))


def test_context_length_is_prompt_plus_response_plus_sglangs_headroom():
    assert context_length(_rollout(), 2048) == 50
    assert context_length(_rollout(max_model_len=100), 2048) == 102
    with pytest.raises(ModelTooLongError, match=r"max_model_len \(4096\)"):
        context_length(_rollout(max_model_len=4096), 2048)
    with pytest.raises(ModelTooLongError, match="prompt_length"):
        context_length(_rollout(prompt_length=2040, response_length=16), 2048)
    # SGLang refuses prompts of context_length - 6 tokens or more: a 3-token response budget is too small.
    with pytest.raises(ModelTooLongError, match="context_length >= 39"):
        context_length(_rollout(response_length=3), 2048)
    # Prompts unknown and no max_model_len: SGLang's default, the model's whole context.
    assert context_length(_rollout(prompt_length=None), 2048) == 2048


def test_model_context_length_reads_sglangs_keys_and_rope_factor():
    assert model_context_length(SimpleNamespace(max_position_embeddings=8192)) == 8192
    assert model_context_length(SimpleNamespace(seq_length=100, max_position_embeddings=8192)) == 100
    yarn = SimpleNamespace(max_position_embeddings=4096, rope_scaling={"factor": 4.0, "rope_type": "yarn"})
    assert model_context_length(yarn) == 16384
    llama3 = SimpleNamespace(max_position_embeddings=4096, rope_scaling={"factor": 8.0, "rope_type": "llama3"})
    assert model_context_length(llama3) == 4096
    assert model_context_length(SimpleNamespace()) == 2048


def test_dtype_and_attention_defaults():
    assert [engine_dtype(_rollout(dtype=d), "cuda") for d in ("auto", "bf16", "fp32", "float16")] == [
        "bfloat16",
        "bfloat16",
        "float32",
        "float16",
    ]
    assert engine_dtype(_rollout(), "cpu") == "float32"
    pick = attention_backend
    assert pick(None, device_kind="cuda", hip=False, sglang_version="0.5.23") == "flashinfer"
    assert pick(None, device_kind="cuda", hip=False, sglang_version="0.5.8") == "fa3"
    assert pick(None, device_kind="cuda", hip=True, sglang_version="0.5.23") == "aiter"
    assert pick(None, device_kind="npu", hip=False, sglang_version="0.5.23") is None
    assert pick("triton", device_kind="cuda", hip=False, sglang_version="0.5.8") == "triton"


def _build(**kw):
    values = {
        "model_path": "/m",
        "rollout": _rollout(),
        "options": SGLangRolloutOptions(),
        "fields": FIELDS,
        "device_kind": "cuda",
        "base_gpu_id": 2,
        "tp_size": 2,
        "context": 50,
        "port": 31000,
        "trust_remote_code": False,
        "model_overrides": {},
        "sglang_version": "0.5.23",
    }
    values.update(kw)
    return build_server_args(**values)


def test_build_server_args_sets_hybrid_token_in_token_out_values():
    args = _build(model_overrides={"rope_theta": 5.0}, options=SGLangRolloutOptions(chunked_prefill_size=256))
    expected = {
        "model_path": "/m",
        "skip_tokenizer_init": True,
        "tp_size": 2,
        "dtype": "bfloat16",
        "device": "cuda",
        "base_gpu_id": 2,
        "gpu_id_step": 1,
        "enable_memory_saver": True,
        "context_length": 50,
        "trust_remote_code": False,
        "log_level": "error",
        "port": 31000,
        "mem_fraction_static": 0.5,
        "load_format": "auto",
        "random_seed": 42,
        "json_model_override_args": '{"rope_theta": 5.0}',
        "enable_weights_cpu_backup": True,
        "attention_backend": "flashinfer",
        "chunked_prefill_size": 256,
    }
    assert args == expected
    assert _build(device_kind="cpu")["enable_memory_saver"] is False


def test_build_server_args_refuses_an_option_that_contradicts_a_rollout_key():
    # Without config load's check_config (options built in code): chunked prefill off vs a chunk size.
    with pytest.raises(ValueError, match=r"chunked_prefill_size=256 conflicts with chunked_prefill_size=-1"):
        _build(rollout=_rollout(enable_chunked_prefill=False), options=SGLangRolloutOptions(chunked_prefill_size=256))


def test_build_server_args_needs_the_fields_it_sets():
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        _build(fields=FIELDS - {"skip_tokenizer_init"})
    # A sglang without the backup field: not passed at all.
    assert "enable_weights_cpu_backup" not in _build(fields=FIELDS - {"enable_weights_cpu_backup"})
    with pytest.raises(ValueError, match="gpu_id_step"):
        _build(fields=FIELDS - {"gpu_id_step"})
