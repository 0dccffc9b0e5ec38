"""verl's first-class rollout keys (``actor_rollout_ref.rollout.<key>``) and what they become in TensorRT-LLM.

verl's TensorRT-LLM server (``verl/workers/rollout/trtllm_rollout/trtllm_async_server.py``) maps them as below;
this plugin does the same, and refuses at config load what TensorRT-LLM would not honour:

| rollout key | TensorRT-LLM | note |
|---|---|---|
| gpu_memory_utilization | ``kv_cache_config.free_gpu_memory_fraction`` | share of the GPU memory *free after the model loaded* that the KV cache takes (TensorRT-LLM's meaning; vLLM's counts the weights too); null = 0.5, verl's ``rollout.yaml`` value (TensorRT-LLM's own 0.9 would leave the colocated trainer nothing) |
| enable_prefix_caching | ``kv_cache_config.enable_block_reuse`` | null = TensorRT-LLM's default (on) |
| enforce_eager | ``cuda_graph_config=None`` when true | null/false = CUDA graphs (TensorRT-LLM's default) |
| cudagraph_capture_sizes | ``cuda_graph_config.batch_sizes`` (with ``enable_padding=True``, as verl) | refused with ``enforce_eager=true`` |
| max_num_seqs | ``max_batch_size`` | null = TensorRT-LLM's default |
| max_num_batched_tokens | ``max_num_tokens`` | null = TensorRT-LLM's default (8192); without chunked prefill a prompt longer than it is refused |
| max_model_len | ``max_seq_len`` | null = ``prompt_length + response_length``; at most the model's ``max_position_embeddings`` |
| enable_chunked_prefill | ``enable_chunked_prefill`` | null = TensorRT-LLM's default (off) |
| load_format | ``load_format`` | ``auto``/``hf``/``safetensors`` -> ``auto`` (TensorRT-LLM reads the HF folder itself) |
| ignore_eos | ``SamplingParams.ignore_eos`` | per request, no stop token then |
| disable_log_stats | ``print_iter_log = not disable_log_stats`` | verl's default true is TensorRT-LLM's default (no per-iteration log) |
| tensor_model_parallel_size | ``tensor_parallel_size`` | 1 only: the spec declares no ``tensor_parallel`` (core refuses more) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLLOUT = "actor_rollout_ref.rollout"
KWARGS = f"{ROLLOUT}.engine_kwargs.trtllm"
#: ``rollout.load_format`` -> TensorRT-LLM's ``LoadFormat`` name.
LOAD_FORMATS = {"auto": "auto", "hf": "auto", "safetensors": "auto"}
#: TensorRT-LLM's ``max_num_tokens`` default (``BaseLlmArgs.max_num_tokens``).
TRTLLM_MAX_NUM_TOKENS = 8192
#: ``gpu_memory_utilization`` when the rollout leaves it null (verl's rollout.yaml value).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5


def _raw_kwargs(rollout: Any) -> Mapping[str, Any]:
    raw = (getattr(rollout, "engine_kwargs", None) or {}).get("trtllm", {}) or {}
    return raw if isinstance(raw, Mapping) else {}


def check_trtllm_rollout_config(rollout: Any, *, root: Any = None) -> list[tuple[str, str]]:
    """``(dotted key, message)`` for rollout keys the ``trtllm`` engine cannot honour (the spec's ``check_config``).

    * with ``root`` (the whole config, plugin API 2.3): a placement the engine is not built for
      (``trainer.controller=ray`` or several workers, :func:`verl_trtllm.builder.placement_problem`), at config
      load rather than when the engine is built;

    * ``load_format`` other than ``auto``/``hf``/``safetensors``;
    * ``cudagraph_capture_sizes`` or ``engine_kwargs.trtllm.cuda_graph_config`` with ``enforce_eager=true``
      (TensorRT-LLM then runs without CUDA graphs: ``cuda_graph_config=None``);
    * a prompt length above the step token budget without chunked prefill (TensorRT-LLM refuses such prompts).
    """
    problems: list[tuple[str, str]] = []
    if root is not None:
        from verl_trtllm.builder import placement_problem

        problem = placement_problem(root)
        if problem is not None:
            problems.append(("trainer.controller", problem))
    fmt = getattr(rollout, "load_format", None) or "auto"
    if fmt not in LOAD_FORMATS:
        problems.append(
            (f"{ROLLOUT}.load_format", f"={fmt!r}: rollout engine 'trtllm' loads with {sorted(LOAD_FORMATS)}")
        )
    if getattr(rollout, "enforce_eager", None):
        if getattr(rollout, "cudagraph_capture_sizes", None):
            problems.append(
                (
                    f"{ROLLOUT}.cudagraph_capture_sizes",
                    "chooses the batch sizes TensorRT-LLM captures as CUDA graphs, but enforce_eager=true runs it "
                    "without CUDA graphs (cuda_graph_config=None); remove one of the two",
                )
            )
        if _raw_kwargs(rollout).get("cuda_graph_config") is not None:
            problems.append(
                (
                    f"{KWARGS}.cuda_graph_config",
                    f"has no effect with {ROLLOUT}.enforce_eager=true (TensorRT-LLM then runs without CUDA graphs); "
                    "remove one of the two",
                )
            )
    budget = getattr(rollout, "max_num_batched_tokens", None) or TRTLLM_MAX_NUM_TOKENS
    prompt_length = getattr(rollout, "prompt_length", None)
    if prompt_length and not getattr(rollout, "enable_chunked_prefill", None) and int(prompt_length) > int(budget):
        problems.append(
            (
                f"{ROLLOUT}.max_num_batched_tokens",
                f"={budget} (TensorRT-LLM's max_num_tokens) is below rollout.prompt_length={prompt_length}: "
                "TensorRT-LLM refuses a prompt longer than it without chunked prefill; raise it, or set "
                f"{ROLLOUT}.enable_chunked_prefill=true",
            )
        )
    return problems


def load_format(rollout: Any) -> str:
    """TensorRT-LLM's ``load_format`` for ``rollout.load_format`` (``auto`` when unset).

    Raises:
        ValueError: a format TensorRT-LLM does not read a HF checkpoint with.
    """
    fmt = getattr(rollout, "load_format", None) or "auto"
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"{ROLLOUT}.load_format={fmt!r}: rollout engine 'trtllm' loads with {sorted(LOAD_FORMATS)}")
    return LOAD_FORMATS[fmt]


def cuda_graph_config(rollout: Any, options: Any) -> tuple[bool, dict[str, Any] | None]:
    """``(pass it, value)`` for ``LLM(cuda_graph_config=...)``.

    ``enforce_eager=true`` -> ``(True, None)`` (no CUDA graphs); ``cudagraph_capture_sizes`` -> the batch sizes with
    ``enable_padding=True`` (verl's server) under ``engine_kwargs.trtllm.cuda_graph_config``; neither -> the
    options' mapping if set, else ``(False, None)`` (TensorRT-LLM's default ``CudaGraphConfig()``).

    Raises:
        ValueError: CUDA-graph settings together with ``enforce_eager=true``.
    """
    sizes = getattr(rollout, "cudagraph_capture_sizes", None)
    extra = getattr(options, "cuda_graph_config", None)
    if getattr(rollout, "enforce_eager", None):
        if sizes or extra is not None:
            raise ValueError(
                f"{ROLLOUT}.enforce_eager=true runs TensorRT-LLM without CUDA graphs; remove "
                f"{ROLLOUT}.cudagraph_capture_sizes / {KWARGS}.cuda_graph_config"
            )
        return True, None
    if not sizes and extra is None:
        return False, None
    merged = dict(extra or {})
    if sizes:
        merged.setdefault("enable_padding", True)
        merged["batch_sizes"] = [int(s) for s in sizes]
    return True, merged


def kv_cache_config(rollout: Any, options: Any) -> dict[str, Any]:
    """``LLM(kv_cache_config=...)`` as a plain dict: the rollout keys' two fields under the options' mapping."""
    share = getattr(rollout, "gpu_memory_utilization", None)
    out: dict[str, Any] = {
        "free_gpu_memory_fraction": float(DEFAULT_GPU_MEMORY_UTILIZATION if share is None else share)
    }
    reuse = getattr(rollout, "enable_prefix_caching", None)
    if reuse is not None:
        out["enable_block_reuse"] = bool(reuse)
    out.update(getattr(options, "kv_cache_config", None) or {})
    return out
