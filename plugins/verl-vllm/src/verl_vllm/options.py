"""Options of the ``vllm`` rollout engine: ``actor_rollout_ref.rollout.engine_kwargs.vllm``.

Validated by the config system when the config is loaded (an unknown key or a bad value fails before
any model is loaded). Only attrs and the standard library are imported, so listing plugins stays cheap.
Names follow vLLM's engine arguments (``vllm.EngineArgs``) and verl's rollout config
(``verl/workers/config/rollout.py``) where one exists.
"""

from __future__ import annotations

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

    def __attrs_post_init__(self) -> None:
        for name in ("kv_cache_space_gib", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"engine_kwargs.vllm.{name} must be an integer, got {value!r}")
