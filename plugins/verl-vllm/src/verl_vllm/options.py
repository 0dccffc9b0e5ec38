"""Options of the ``vllm`` rollout engine: ``actor_rollout_ref.rollout.engine_kwargs.vllm``.

Validated by the config system when the config is loaded (an unknown key or a bad value fails before
any model is loaded). Only attrs and the standard library are imported, so listing plugins stays cheap.
Names follow vLLM's engine arguments (``vllm.EngineArgs``) and verl's rollout config
(``verl/workers/config/rollout.py``) where one exists.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

DTYPES = ("float32", "bfloat16", "float16")
SLEEP_LEVELS = (1, 2)


def _positive(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"engine_kwargs.vllm.{attribute.name} must be a positive number or null, got {value!r}")


def _fraction(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"engine_kwargs.vllm.{attribute.name} must be in (0, 1], got {value!r}")


def _dtype(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and value not in DTYPES:
        raise ValueError(
            f"engine_kwargs.vllm.dtype={value!r} is not one of {list(DTYPES)} or null (null: rollout.dtype)"
        )


def _threads_bind(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    named = value in ("auto", "nobind")
    ids = isinstance(value, str) and bool(value) and all(c in "0123456789-,|" for c in value)
    if not (named or ids):
        raise ValueError(
            f"engine_kwargs.vllm.omp_threads_bind={value!r}: use 'auto', 'nobind' or CPU ids such as '0-1' "
            "(VLLM_CPU_OMP_THREADS_BIND syntax; '|' separates ranks)"
        )


def parse_mapping(name: str, value: Any) -> dict[str, Any] | None:
    """``value`` as a dict: a mapping (copied), a JSON object string (verl's vLLM server takes both), or None.

    Raises:
        ValueError: anything else, naming ``engine_kwargs.vllm.<name>``.
    """
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"engine_kwargs.vllm.{name}={value!r} is not a JSON object ({exc})") from None
        if isinstance(parsed, dict):
            return parsed
    raise ValueError(f"engine_kwargs.vllm.{name} must be a mapping (or a JSON object string) or null, got {value!r}")


def _mapping(name: str) -> Any:
    return lambda value: parse_mapping(name, value)


def _optional_bool(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"engine_kwargs.vllm.{attribute.name} must be true, false or null, got {value!r}")


def _kv_cache_dtype(inst: object, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(
            f"engine_kwargs.vllm.kv_cache_dtype must be one of vLLM's cache dtypes (auto, fp8, fp8_e4m3, "
            f"fp8_e5m2, ...) or null, got {value!r}"
        )


@attrs.frozen(kw_only=True)
class VLLMRolloutOptions:
    """vLLM engine options (``actor_rollout_ref.rollout.engine_kwargs.vllm.<key>``).

    Attributes:
        dtype: weights/activations dtype of the vLLM model; null follows ``rollout.dtype`` (core default
            float32). On CPUs without AVX-512/AMX, bf16 runs much slower than float32 (see the README).
        enforce_eager: no CUDA graphs / torch.compile; null = true on cpu, false on cuda.
        kv_cache_space_gib: CPU KV-cache size in whole GiB (``VLLM_CPU_KVCACHE_SPACE``); null keeps the
            environment's value, else 1 GiB. Ignored on cuda (see ``gpu_memory_utilization``).
        omp_threads_bind: CPU thread binding (``VLLM_CPU_OMP_THREADS_BIND``): ``nobind`` (default; the
            trainer shares the process and its threads), ``auto`` or CPU ids such as ``0-1``; null keeps
            the environment's value. Ignored on cuda.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache), in (0, 1]; the
            default 0.5 leaves room for the colocated trainer. Ignored on cpu.
        max_num_seqs: sequences decoded together (vLLM's scheduler batch), >= 1.
        max_model_len: context limit of the engine (prompt + response tokens); null =
            ``rollout.prompt_length + rollout.response_length`` (verl's default), at most the model's
            ``max_position_embeddings``. Must be >= ``rollout.prompt_length + rollout.response_length``.
        max_num_batched_tokens: tokens per scheduler step; null = vLLM's default.
        enable_prefix_caching: reuse KV blocks of shared prompt prefixes (the ``n`` samples of a prompt).
        enable_chunked_prefill: split long prefills over scheduler steps; null = false on cpu, vLLM's default
            on cuda. On cpu a partial prefill of a seeded request crashes vLLM 0.32 (it rewinds the request's
            generator with ``set_offset``, which CPU generators do not have), and the trainer seeds every row.
        enable_sleep_mode: build the engine with vLLM's sleep mode on cuda (needed by ``sleep()``).
        sleep_level: 1 = offload weights to CPU and drop the KV cache; 2 = discard weights too (then
            ``update_weights`` must follow each ``wake_up`` before generating, as in verl's hybrid engine).
        seed: engine seed; null = ``rollout.seed``.
        compilation_config: vLLM's ``CompilationConfig`` fields (``vllm.LLM(compilation_config=...)``), a
            mapping or a JSON object string as verl's vLLM server takes it; ``rollout.cudagraph_capture_sizes``
            is merged in (setting ``cudagraph_capture_sizes`` both ways is an error naming both). vLLM checks
            the field names when the engine starts. CUDA-graph fields are refused on cpu, and ``mode`` and
            CUDA-graph fields are refused under ``enforce_eager`` (vLLM turns both off there).
        kv_cache_dtype: KV-cache storage dtype (vLLM's ``kv_cache_dtype``, e.g. ``fp8``); null = vLLM's
            ``auto`` (the model dtype). On cpu only ``auto``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2`` (what vLLM's
            CPU attention backend stores) are accepted.
        async_scheduling: vLLM's asynchronous scheduling (the next step is scheduled while the current one
            runs); null = vLLM's default. ``true`` is refused on cpu, where vLLM always turns it off.
        additional_config: vLLM's ``additional_config`` mapping, passed as is (read by vLLM's platform
            plugins, e.g. vllm-ascend, and some models); null = none.
    """

    dtype: str | None = attrs.field(default=None, validator=_dtype)
    enforce_eager: bool | None = attrs.field(default=None)
    kv_cache_space_gib: int | None = attrs.field(default=None, validator=_positive)
    omp_threads_bind: str | None = attrs.field(default="nobind", validator=_threads_bind)
    gpu_memory_utilization: float = attrs.field(default=0.5, validator=_fraction)
    max_num_seqs: int = attrs.field(default=256, validator=_positive)
    max_model_len: int | None = attrs.field(default=None, validator=_positive)
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=_positive)
    enable_prefix_caching: bool = attrs.field(default=True)
    enable_chunked_prefill: bool | None = attrs.field(default=None)
    enable_sleep_mode: bool = attrs.field(default=True)
    sleep_level: int = attrs.field(default=1, validator=attrs.validators.in_(SLEEP_LEVELS))
    seed: int | None = attrs.field(default=None)
    compilation_config: dict[str, Any] | str | None = attrs.field(
        default=None, converter=_mapping("compilation_config")
    )
    kv_cache_dtype: str | None = attrs.field(default=None, validator=_kv_cache_dtype)
    async_scheduling: bool | None = attrs.field(default=None, validator=_optional_bool)
    additional_config: dict[str, Any] | str | None = attrs.field(default=None, converter=_mapping("additional_config"))

    def __attrs_post_init__(self) -> None:
        for name in ("kv_cache_space_gib", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"engine_kwargs.vllm.{name} must be an integer, got {value!r}")
