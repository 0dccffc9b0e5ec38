"""The keyword arguments of ``tensorrt_llm.LLM(...)`` for one engine (a plain dict; TensorRT-LLM is not imported).

Nested configs (``kv_cache_config``, ``cuda_graph_config``, ``sleep_config``, ...) are plain dicts:
``TorchLlmArgs`` is a pydantic model and validates them into ``KvCacheConfig`` etc. itself, and a bad value is
reported by TensorRT-LLM naming the field. What comes from where:

* fixed by the engine: ``backend="pytorch"``, ``orchestrator_type="ray"`` and the worker extension (TensorRT-LLM's
  collective RPC into its worker exists only with the Ray orchestrator), ``skip_tokenizer_init=True``
  (token-in/token-out), ``tensor_parallel_size=1``;
* from verl's rollout keys: :mod:`verl_trtllm.rollout_keys`;
* from ``actor_rollout_ref.model``: ``trust_remote_code``, and ``override_config`` as ``model_kwargs``
  (TensorRT-LLM's model-config overrides) merged with ``engine_kwargs.trtllm.model_kwargs``;
* from the options: ``dtype``, ``sampler_type``, ``sleep_config`` (``enable_sleep_mode``/``sleep_level``), and
  every pass-through argument that is set (:func:`verl_trtllm.options.set_passthrough`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verl_trtllm.options import KWARGS, set_passthrough
from verl_trtllm.rollout_keys import cuda_graph_config, kv_cache_config, load_format
from verl_trtllm.translate import sleep_config_kwargs

#: ``ray_worker_extension_cls``: the class TensorRT-LLM mixes into its Ray GPU worker.
EXTENSION_QUALNAME = "verl_trtllm.worker_extension.VerlWorkerExtension"
_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def resolve_dtype_name(options: Any, rollout: Any) -> str:
    """``options.dtype``, else ``rollout.dtype`` by TensorRT-LLM's name (``auto`` = bfloat16 on a GPU, core's rule).

    Raises:
        ValueError: a dtype TensorRT-LLM does not run (not float32/bfloat16/float16).
    """
    value = getattr(options, "dtype", None) or getattr(rollout, "dtype", None) or "auto"
    name = _DTYPE_NAMES.get(str(value), str(value))
    if name == "auto":
        return "bfloat16"
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"actor_rollout_ref.rollout.dtype={value!r}: TensorRT-LLM runs float32, bfloat16 or float16")
    return name


def merged_model_kwargs(overrides: Mapping[str, Any], options: Any) -> dict[str, Any] | None:
    """``model.override_config`` (already split: the attribute overrides) with ``engine_kwargs.trtllm.model_kwargs``.

    Raises:
        ValueError: a key set in both places, naming both keys.
    """
    extra = dict(getattr(options, "model_kwargs", None) or {})
    both = sorted(set(overrides) & set(extra))
    if both:
        raise ValueError(
            f"actor_rollout_ref.model.override_config.{both[0]} is also set as {KWARGS}.model_kwargs.{both[0]}; "
            "set it once (override_config also reaches the trainer's model)"
        )
    merged = {**{str(k): v for k, v in overrides.items()}, **extra}
    return merged or None


def llm_kwargs(
    *,
    model_path: str,
    rollout: Any,
    options: Any,
    max_seq_len: int,
    dtype: str,
    trust_remote_code: bool,
    model_overrides: Mapping[str, Any],
    memory_tags: Sequence[str],
    sampler: str | None = "TRTLLMSampler",
) -> dict[str, Any]:
    """Every keyword argument of ``tensorrt_llm.LLM`` for this engine.

    Args:
        model_path: resolved HF folder.
        rollout: the ``actor_rollout_ref.rollout`` section.
        options: :class:`verl_trtllm.options.TRTLLMRolloutOptions`.
        max_seq_len: the context limit (prompt + response tokens).
        dtype: ``float32``/``bfloat16``/``float16``.
        trust_remote_code: ``actor_rollout_ref.model.trust_remote_code``.
        model_overrides: ``model.override_config``'s attribute overrides (:func:`verl.models.hf_config.split_override_config`).
        memory_tags: the installed ``ExecutorMemoryType`` values (for ``sleep_config`` at level 2).
        sampler: the ``sampler_type`` to pass (:func:`resolve_sampler`); None passes none (a release without it).

    Raises:
        ValueError: CUDA-graph settings with ``enforce_eager``, a bad ``load_format``, or an override set both ways.
    """
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        "backend": "pytorch",
        "orchestrator_type": "ray",
        "ray_worker_extension_cls": EXTENSION_QUALNAME,
        "skip_tokenizer_init": True,
        "trust_remote_code": bool(trust_remote_code),
        "tensor_parallel_size": 1,
        "dtype": dtype,
        "max_seq_len": int(max_seq_len),
        "kv_cache_config": kv_cache_config(rollout, options),
        "load_format": load_format(rollout),
        "print_iter_log": not bool(getattr(rollout, "disable_log_stats", True)),
    }
    if sampler is not None:
        kwargs["sampler_type"] = sampler
    for key, name in (("max_num_seqs", "max_batch_size"), ("max_num_batched_tokens", "max_num_tokens")):
        value = getattr(rollout, key, None)
        if value is not None:
            kwargs[name] = int(value)
    chunked = getattr(rollout, "enable_chunked_prefill", None)
    if chunked is not None:
        kwargs["enable_chunked_prefill"] = bool(chunked)
    give, graphs = cuda_graph_config(rollout, options)
    if give:
        kwargs["cuda_graph_config"] = graphs
    if options.enable_sleep_mode:
        kwargs["sleep_config"] = sleep_config_kwargs(options.sleep_level, memory_tags)
    model_kwargs = merged_model_kwargs(model_overrides, options)
    if model_kwargs is not None:
        kwargs["model_kwargs"] = model_kwargs
    kwargs.update(set_passthrough(options))
    return kwargs


def resolve_sampler(requested: str | None, llm_fields: frozenset[str] | None) -> tuple[str, bool]:
    """``(sampler in use, whether LLM(...) gets sampler_type)`` for ``engine_kwargs.trtllm.sampler_type``.

    Newer TensorRT-LLM releases removed ``sampler_type`` (and ``TRTLLMSampler``): there the sampler is
    ``TorchSampler`` and the argument is not passed. Null means ``TRTLLMSampler`` (verl's choice) where the field
    exists. ``llm_fields`` None (the installed field list is unknown) passes the argument.

    Raises:
        ValueError: ``TRTLLMSampler`` asked for explicitly on a release without ``sampler_type``.
    """
    if llm_fields is None or "sampler_type" in llm_fields:
        return requested or "TRTLLMSampler", True
    if requested == "TRTLLMSampler":
        raise ValueError(
            "actor_rollout_ref.rollout.engine_kwargs.trtllm.sampler_type=TRTLLMSampler: the installed TensorRT-LLM "
            "has no sampler_type (TRTLLMSampler was removed; TorchSampler is its only sampler): unset it"
        )
    return "TorchSampler", False
