"""The argument names ``tensorrt_llm.LLM(backend="pytorch")`` accepts, as a snapshot bundled with the plugin.

``LLM(**kwargs)`` validates its keyword arguments against ``TorchLlmArgs.model_fields`` (``BaseLLM.__init__``
raises ``"LLM got invalid argument"`` for anything else). verl passes ``rollout.engine_kwargs.trtllm`` into
those arguments; this plugin checks the same names at config load instead, where TensorRT-LLM is not
importable (it cannot be installed on a CPU machine), so a misspelt key fails before anything starts.

How it was made: the field declarations of ``class BaseLlmArgs`` and ``class TorchLlmArgs`` in
``tensorrt_llm/llmapi/llm_args.py`` of NVIDIA/TensorRT-LLM were read from a stored copy of the file (the
revision with ``RayPlacementConfig`` and ``TorchLlmArgs.enable_sleep``, 139,423 characters, 2025-26 main) and
transcribed in declaration order; ``TrtLlmArgs``-only fields (``build_config``, ``quant_config``, ...) are left
out because the PyTorch backend refuses them. :data:`LATER_FIELDS` lists what the 1.3 line this plugin targets
adds on top (``sleep_config``: verl's ``trtllm_async_server.py`` passes it and TensorRT-LLM's ``SleepConfig``
reference documents it). On a machine with TensorRT-LLM, ``python -m verl_trtllm.llm_args_snapshot`` prints
the installed version's names and the differences from this snapshot (``scripts/check_cuda.sh`` runs it), which
is how the snapshot is refreshed.
"""

from __future__ import annotations

import sys

#: ``BaseLlmArgs`` fields (both backends), in declaration order.
BASE_LLM_ARGS_FIELDS: tuple[str, ...] = (
    "model",
    "tokenizer",
    "tokenizer_mode",
    "custom_tokenizer",
    "skip_tokenizer_init",
    "trust_remote_code",
    "tensor_parallel_size",
    "dtype",
    "revision",
    "tokenizer_revision",
    "model_kwargs",
    "pipeline_parallel_size",
    "context_parallel_size",
    "gpus_per_node",
    "moe_cluster_parallel_size",
    "moe_tensor_parallel_size",
    "moe_expert_parallel_size",
    "enable_attention_dp",
    "enable_lm_head_tp_in_adp",
    "pp_partition",
    "cp_config",
    "load_format",
    "enable_lora",
    "lora_config",
    "kv_cache_config",
    "enable_chunked_prefill",
    "guided_decoding_backend",
    "batched_logits_processor",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "peft_cache_config",
    "scheduler_config",
    "cache_transceiver_config",
    "sparse_attention_config",
    "speculative_config",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_beam_width",
    "max_num_tokens",
    "gather_generation_logits",
    "num_postprocess_workers",
    "postprocess_tokenizer_dir",
    "reasoning_parser",
    "decoding_config",
    "mpi_session",
    "otlp_traces_endpoint",
    "backend",
    "return_perf_metrics",
    "perf_metrics_max_requests",
    "orchestrator_type",
    "env_overrides",
)

#: ``TorchLlmArgs`` fields (PyTorch backend) beyond the base ones, in declaration order.
TORCH_LLM_ARGS_FIELDS: tuple[str, ...] = (
    "garbage_collection_gen0_threshold",
    "cuda_graph_config",
    "attention_dp_config",
    "disable_overlap_scheduler",
    "moe_config",
    "nvfp4_gemm_config",
    "attn_backend",
    "sampler_type",
    "sampler_force_async_worker",
    "enable_iter_perf_stats",
    "enable_iter_req_stats",
    "print_iter_log",
    "batch_wait_timeout_ms",
    "batch_wait_timeout_iters",
    "batch_wait_max_tokens_ratio",
    "torch_compile_config",
    "enable_autotuner",
    "enable_layerwise_nvtx_marker",
    "enable_min_latency",
    "stream_interval",
    "force_dynamic_quantization",
    "allreduce_strategy",
    "checkpoint_loader",
    "checkpoint_format",
    "kv_connector_config",
    "mm_encoder_only",
    "ray_worker_extension_cls",
    "ray_placement_config",
    "enable_sleep",
    "use_cute_dsl_blockscaling_mm",
    "use_cute_dsl_blockscaling_bmm",
    "disable_flashinfer_sampling",
    "max_stats_len",
    "layer_wise_benchmarks_config",
)

#: Fields of the 1.3 line not in the transcribed revision, with where they were seen.
LATER_FIELDS: dict[str, str] = {
    "sleep_config": "SleepConfig(restore_modes=...): TensorRT-LLM's llmapi reference and verl's trtllm_async_server.py",
}

#: Every argument name of ``tensorrt_llm.LLM(backend="pytorch")`` this plugin knows, sorted.
LLM_ARGS_FIELDS: tuple[str, ...] = tuple(sorted({*BASE_LLM_ARGS_FIELDS, *TORCH_LLM_ARGS_FIELDS, *LATER_FIELDS}))


def installed_fields() -> tuple[str, ...]:
    """The installed TensorRT-LLM's ``TorchLlmArgs.model_fields`` names, sorted.

    Raises:
        ImportError: TensorRT-LLM is not installed.
    """
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

    return tuple(sorted(TorchLlmArgs.model_fields))


def compare(installed: tuple[str, ...], snapshot: tuple[str, ...] = LLM_ARGS_FIELDS) -> dict[str, list[str]]:
    """``{"only_installed": [...], "only_snapshot": [...]}``: how an installed version differs from the snapshot."""
    have, known = set(installed), set(snapshot)
    return {"only_installed": sorted(have - known), "only_snapshot": sorted(known - have)}


def main(argv: list[str] | None = None) -> int:
    """Print the installed names and the differences; exit 0 (a difference is information, not a failure)."""
    import tensorrt_llm

    installed = installed_fields()
    diff = compare(installed)
    print(f"tensorrt_llm {tensorrt_llm.__version__}: {len(installed)} TorchLlmArgs fields")
    print("installed, not in the snapshot:", ", ".join(diff["only_installed"]) or "-")
    print("in the snapshot, not installed:", ", ".join(diff["only_snapshot"]) or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
