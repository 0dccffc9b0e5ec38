"""Options of the ``trtllm`` rollout engine: ``actor_rollout_ref.rollout.engine_kwargs.trtllm``.

verl passes ``rollout.engine_kwargs.trtllm`` into ``tensorrt_llm.LLM(...)`` (``trtllm_async_server.py``:
``**engine_kwargs`` over its own arguments). Here every accepted key is a field of
:class:`TRTLLMRolloutOptions`, so core's config load refuses a misspelt key with a close spelling before anything
starts:

* the plugin's own documented options (:data:`OWN_FIELDS`): ``dtype``, ``enable_sleep_mode``, ``sleep_level``,
  ``sampler_type``, and the three mappings merged with what the engine derives from verl's rollout keys
  (``kv_cache_config``, ``cuda_graph_config``, ``model_kwargs``);
* every other ``LLM`` argument name of the TensorRT-LLM version read (:mod:`verl_trtllm.llm_args_snapshot`),
  default null = TensorRT-LLM's default, passed to ``LLM`` unchanged when set (TensorRT-LLM validates the value);
* the arguments the engine sets itself (:data:`REFUSED`): accepted by name, refused when set, with the reason
  and the key to use instead (a value there would be overwritten or would break the engine).

Only attrs and the standard library are imported, so ``verl plugins`` stays cheap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from verl_trtllm.llm_args_snapshot import LLM_ARGS_FIELDS

KWARGS = "actor_rollout_ref.rollout.engine_kwargs.trtllm"
ROLLOUT = "actor_rollout_ref.rollout"
DTYPES = ("float32", "bfloat16", "float16")
SAMPLERS = ("TRTLLMSampler", "TorchSampler")
SLEEP_LEVELS = (1, 2)

_ONE_WORKER = (
    "the trtllm engine runs one TensorRT-LLM worker on the trainer's GPU (hybrid mode; "
    f"{ROLLOUT}.tensor_model_parallel_size=1 only), so model parallelism inside it is not built"
)
_NO_TOKENIZER = (
    "the trtllm engine is token-in/token-out (skip_tokenizer_init=True: the trainer's token ids go in, response "
    "ids come out), so TensorRT-LLM's tokenizer settings have nothing to act on"
)

#: ``LLM`` arguments the engine sets itself -> why a value in ``engine_kwargs.trtllm`` is refused.
REFUSED: dict[str, str] = {
    "model": "set from actor_rollout_ref.model.path",
    "backend": "always 'pytorch' (TensorRT-LLM's PyTorch backend; the TensorRT engine-build backend is not built)",
    "orchestrator_type": (
        "always 'ray': TensorRT-LLM's worker extensions and collective RPC, which the weight sync uses, exist only "
        "with its Ray orchestrator"
    ),
    "ray_worker_extension_cls": "always verl_trtllm.worker_extension.VerlWorkerExtension (receives the weight sync)",
    "ray_placement_config": "TensorRT-LLM places its worker itself (hybrid mode with trainer.controller=local)",
    "skip_tokenizer_init": _NO_TOKENIZER,
    "tokenizer": _NO_TOKENIZER,
    "tokenizer_mode": _NO_TOKENIZER,
    "custom_tokenizer": _NO_TOKENIZER,
    "tokenizer_revision": _NO_TOKENIZER,
    "postprocess_tokenizer_dir": _NO_TOKENIZER,
    "num_postprocess_workers": _NO_TOKENIZER,
    "reasoning_parser": _NO_TOKENIZER,
    "guided_decoding_backend": "guided decoding is not used by RL rollouts (no request sets guided_decoding)",
    "trust_remote_code": "set from actor_rollout_ref.model.trust_remote_code",
    "tensor_parallel_size": f"set from {ROLLOUT}.tensor_model_parallel_size",
    "pipeline_parallel_size": f"verl's key is {ROLLOUT}.pipeline_model_parallel_size; {_ONE_WORKER}",
    "context_parallel_size": _ONE_WORKER,
    "moe_expert_parallel_size": f"verl's key is {ROLLOUT}.expert_parallel_size; {_ONE_WORKER}",
    "moe_tensor_parallel_size": _ONE_WORKER,
    "moe_cluster_parallel_size": _ONE_WORKER,
    "enable_attention_dp": _ONE_WORKER,
    "gpus_per_node": _ONE_WORKER,
    "max_batch_size": f"set from {ROLLOUT}.max_num_seqs (verl's name)",
    "max_num_tokens": f"set from {ROLLOUT}.max_num_batched_tokens (verl's name)",
    "max_seq_len": f"set from {ROLLOUT}.max_model_len (verl's name; null = prompt_length + response_length)",
    "enable_chunked_prefill": f"set from {ROLLOUT}.enable_chunked_prefill (verl's name)",
    "load_format": f"set from {ROLLOUT}.load_format (verl's name)",
    "print_iter_log": f"set from {ROLLOUT}.disable_log_stats (false = TensorRT-LLM's per-iteration log)",
    "enable_sleep": f"set from {KWARGS}.enable_sleep_mode (the sleep/wake-up switch of older TensorRT-LLM)",
    "sleep_config": f"built from {KWARGS}.enable_sleep_mode and sleep_level",
    "mpi_session": "a live MPI session object, not a config value (the Ray orchestrator uses none)",
    "batched_logits_processor": "a Python object, not a config value",
    "checkpoint_loader": "a Python object, not a config value (use checkpoint_format)",
}

#: Keys inside the merged mappings that a rollout key sets.
REFUSED_NESTED: dict[str, dict[str, str]] = {
    "kv_cache_config": {
        "free_gpu_memory_fraction": f"set from {ROLLOUT}.gpu_memory_utilization (verl's name)",
        "enable_block_reuse": f"set from {ROLLOUT}.enable_prefix_caching (verl's name)",
    },
    "cuda_graph_config": {
        "batch_sizes": f"set from {ROLLOUT}.cudagraph_capture_sizes (verl's name)",
    },
}


def parse_mapping(name: str, value: Any) -> dict[str, Any] | None:
    """``value`` as a plain dict: a mapping (copied), a JSON object string, or None.

    Raises:
        ValueError: anything else, naming ``engine_kwargs.trtllm.<name>``.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{KWARGS}.{name}={value!r} is not a JSON object ({exc})") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"{KWARGS}.{name} must be a mapping (or a JSON object string) or null, got {value!r}")


def _mapping_without(name: str) -> Any:
    refused = REFUSED_NESTED.get(name, {})

    def convert(value: Any) -> dict[str, Any] | None:
        parsed = parse_mapping(name, value)
        for key in sorted(set(parsed or ()) & set(refused)):
            raise ValueError(f"{KWARGS}.{name}.{key} is not accepted: {refused[key]}")
        return parsed

    return convert


def _refused(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        raise ValueError(f"{KWARGS}.{attribute.name} is not accepted: {REFUSED[attribute.name]}")


def _choice(choices: tuple[Any, ...]) -> Any:
    def check(inst: object, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            raise ValueError(f"{KWARGS}.{attribute.name}={value!r} is not one of {list(choices)}")

    return check


def _optional_choice(choices: tuple[Any, ...]) -> Any:
    check = _choice(choices)

    def optional(inst: object, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None:
            check(inst, attribute, value)

    return optional


def _bool(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{KWARGS}.{attribute.name} must be true or false, got {value!r}")


#: The plugin's own options (documented in :class:`TRTLLMRolloutOptions`).
OWN_FIELDS: dict[str, Any] = {
    "dtype": attrs.field(default=None, type=str | None, validator=_optional_choice(DTYPES)),
    "enable_sleep_mode": attrs.field(default=True, type=bool, validator=_bool),
    "sleep_level": attrs.field(default=1, type=int, validator=_choice(SLEEP_LEVELS)),
    "sampler_type": attrs.field(default=None, type=str | None, validator=_optional_choice(SAMPLERS)),
    "kv_cache_config": attrs.field(default=None, type=Any, converter=_mapping_without("kv_cache_config")),
    "cuda_graph_config": attrs.field(default=None, type=Any, converter=_mapping_without("cuda_graph_config")),
    "model_kwargs": attrs.field(default=None, type=Any, converter=_mapping_without("model_kwargs")),
}

#: ``LLM`` arguments passed through unchanged when set (every snapshot name not owned and not refused).
PASSTHROUGH: tuple[str, ...] = tuple(name for name in LLM_ARGS_FIELDS if name not in OWN_FIELDS and name not in REFUSED)

_missing = sorted(set(REFUSED) - set(LLM_ARGS_FIELDS))
if _missing:  # a refusal must name a real LLM argument (else it would also accept a key TensorRT-LLM lacks)
    raise RuntimeError(f"verl_trtllm.options: refused keys not in the llm_args snapshot: {_missing}")

_fields: dict[str, Any] = dict(OWN_FIELDS)
_fields.update({name: attrs.field(default=None, type=Any, validator=_refused) for name in REFUSED})
_fields.update({name: attrs.field(default=None, type=Any) for name in PASSTHROUGH})

TRTLLMRolloutOptions = attrs.make_class("TRTLLMRolloutOptions", _fields, frozen=True, kw_only=True, repr=False, eq=True)
TRTLLMRolloutOptions.__module__ = __name__
TRTLLMRolloutOptions.__doc__ = f"""TensorRT-LLM engine options (``{KWARGS}.<key>``), validated at config load.

Own options:

* ``dtype``: ``float32``/``bfloat16``/``float16``; null follows ``rollout.dtype`` (``auto`` = bfloat16 on cuda).
* ``enable_sleep_mode`` (true): build the engine with TensorRT-LLM's ``SleepConfig`` so ``sleep()`` frees GPU
  memory between generations (``LLM.release`` / ``LLM.resume``); false makes ``sleep``/``wake_up`` no-ops.
* ``sleep_level`` (1): 1 = weights backed up to host memory on sleep (TensorRT-LLM's default restore mode for
  them), KV cache dropped; 2 = weights discarded too (``SleepConfig.restore_modes`` ``model_weights: NONE``, as
  verl configures it): an ``update_weights`` must follow every wake-up before generating.
* ``sampler_type``: TensorRT-LLM's sampler, ``TRTLLMSampler`` (verl's choice; null means it) or
  ``TorchSampler``. Releases that removed the argument have only ``TorchSampler``: null then passes nothing and
  ``TRTLLMSampler`` is an error. The sampler decides how the chosen token's log-prob is asked for
  (``logprobs=1`` / ``0``, as verl asks).
* ``kv_cache_config``: TensorRT-LLM ``KvCacheConfig`` fields (mapping or JSON string) merged over the ones the
  rollout keys set (``free_gpu_memory_fraction`` from ``rollout.gpu_memory_utilization``, ``enable_block_reuse``
  from ``rollout.enable_prefix_caching``; those two are refused here).
* ``cuda_graph_config``: ``CudaGraphConfig`` fields (``enable_padding``, ``max_batch_size``); ``batch_sizes`` is
  ``rollout.cudagraph_capture_sizes``; refused with ``rollout.enforce_eager=true`` (no CUDA graphs then).
* ``model_kwargs``: TensorRT-LLM's model-config overrides, merged with ``actor_rollout_ref.model.override_config``
  (a key set in both is an error).

Pass-through (null = TensorRT-LLM's default): {", ".join(PASSTHROUGH)}.

Refused (the engine sets them; the error names the key to use): {", ".join(sorted(REFUSED))}.
"""


def set_passthrough(options: Any) -> dict[str, Any]:
    """The pass-through ``LLM`` arguments that are set (not null), by name."""
    return {name: getattr(options, name) for name in PASSTHROUGH if getattr(options, name) is not None}
