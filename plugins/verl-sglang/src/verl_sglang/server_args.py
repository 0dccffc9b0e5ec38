"""The ``sglang.Engine(**server_args)`` keyword arguments of one rollout engine (pure functions, no SGLang import).

Source of the launch arguments: verl ``verl/workers/rollout/sglang_rollout/async_sglang_server.py``
(``launch_server``): ``model_path``, ``dtype``, ``mem_fraction_static``, ``disable_cuda_graph``,
``enable_memory_saver=True``, ``base_gpu_id``, ``gpu_id_step=1``, ``tp_size``, ``load_format``,
``trust_remote_code``, ``max_running_requests``, ``log_level="error"``, ``attention_backend``,
``skip_tokenizer_init``, ``json_model_override_args``, ``enable_weights_cpu_backup`` in hybrid mode, then
``**engine_kwargs``. Differences here: the tokenizer is always skipped (token ids in and out), the context
length follows ``rollout.max_model_len`` (verl leaves SGLang's: the model's whole context), the port is a free
one, and the ``model.override_config`` reaches SGLang (verl sends only its FP8 settings there).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from verl_sglang.options import passthrough_arguments
from verl_sglang.rollout_keys import ROLLOUT, rollout_server_args

#: Positions SGLang keeps free in a request: its scheduler caps max_new_tokens at ``context_length - prompt - 2``
#: (``managers/tp_worker.py``: ``max_req_len = context_len - 1``; ``managers/scheduler.py``:
#: ``max_req_len - input_len - 1``).
CONTEXT_HEADROOM = 2
#: SGLang refuses a prompt of ``context_length - 6`` tokens or more (``max_req_input_len = max_req_len - 5``).
PROMPT_HEADROOM = 7
#: HF config keys SGLang reads the model's context from, in its order (``utils/hf_transformers/common.py``).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
#: ServerArgs fields every supported sglang has and this plugin cannot run without.
REQUIRED_FIELDS = ("model_path", "skip_tokenizer_init", "tp_size", "enable_memory_saver", "base_gpu_id")
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


class ModelTooLongError(ValueError):
    """``rollout.prompt_length + rollout.response_length`` does not fit the SGLang engine's context."""


def model_context_length(hf_config: Any) -> int:
    """The model's context as SGLang derives it (``get_context_length``): the first of
    :data:`CONTEXT_LENGTH_KEYS` set in the config, times ``rope_scaling["factor"]`` unless the scaling names
    ``original_max_position_embeddings`` or is ``llama3``; 2048 when none is set."""
    rope = getattr(hf_config, "rope_scaling", None) or {}
    factor = rope.get("factor", 1) if rope else 1
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = getattr(hf_config, key, None)
        if value is not None:
            return int(factor * value)
    return 2048


def context_length(rollout: Any, model_limit: int) -> int:
    """SGLang's ``context_length``: ``(rollout.max_model_len or prompt_length + response_length) + 2``.

    The 2 extra positions are :data:`CONTEXT_HEADROOM`, so a response of ``response_length`` tokens fits after
    the longest prompt (verl's ``max_model_len`` semantics: prompt + response). Without ``max_model_len`` and
    ``prompt_length`` (a config that does not know its prompts), the model's context, SGLang's own default.

    Raises:
        ModelTooLongError: that exceeds the model's context (SGLang refuses a longer ``context_length``), or the
            longest prompt would leave SGLang less than its prompt headroom; the message names the keys to change.
    """
    prompt_length = getattr(rollout, "prompt_length", None)
    explicit = getattr(rollout, "max_model_len", None)
    if explicit is None and prompt_length is None:
        return int(model_limit)
    prompt = int(prompt_length or 0)
    response = int(getattr(rollout, "response_length", None) or 512)
    length = (int(explicit) if explicit is not None else prompt + response) + CONTEXT_HEADROOM
    if explicit is not None:
        source = f"{ROLLOUT}.max_model_len ({explicit})"
    else:
        source = f"{ROLLOUT}.prompt_length ({prompt}) + response_length ({response})"
    if length > model_limit:
        raise ModelTooLongError(
            f"rollout engine 'sglang': {source} + {CONTEXT_HEADROOM} positions SGLang keeps free = {length} tokens "
            f"exceeds the model's context ({model_limit}); lower data.max_prompt_length / data.max_response_length"
            + ("" if explicit is None else f" or {ROLLOUT}.max_model_len")
        )
    if prompt > length - PROMPT_HEADROOM:
        raise ModelTooLongError(
            f"rollout engine 'sglang': prompts of up to {prompt} tokens need context_length >= {prompt + PROMPT_HEADROOM}"
            f" (SGLang refuses a prompt of context_length - 6 tokens or more), but {source} gives {length}; raise "
            f"data.max_response_length to >= 5 or {ROLLOUT}.max_model_len"
        )
    return length


def engine_dtype(rollout: Any, device_kind: str) -> str:
    """SGLang's ``dtype`` for ``rollout.dtype`` (``auto``: bfloat16 on accelerators, float32 on cpu, as core)."""
    value = str(getattr(rollout, "dtype", None) or "auto")
    name = DTYPE_NAMES.get(value, value)
    if name == "auto":
        return "float32" if device_kind == "cpu" else "bfloat16"
    return name


def _version_tuple(version: str | None) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in (version or "0").split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


def attention_backend(option: str | None, *, device_kind: str, hip: bool, sglang_version: str | None) -> str | None:
    """``engine_kwargs.sglang.attention_backend``, or verl's default when null: ``aiter`` on ROCm, ``flashinfer``
    on CUDA with sglang >= 0.5.12, ``fa3`` before; None (SGLang's choice) elsewhere."""
    if option is not None:
        return option
    if device_kind != "cuda":
        return None
    if hip:
        return "aiter"
    return "flashinfer" if _version_tuple(sglang_version) >= (0, 5, 12) else "fa3"


def build_server_args(
    *,
    model_path: str,
    rollout: Any,
    options: Any,
    fields: Iterable[str],
    device_kind: str,
    base_gpu_id: int,
    tp_size: int,
    context: int,
    port: int,
    trust_remote_code: bool,
    model_overrides: Mapping[str, Any],
    hip: bool = False,
    sglang_version: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``sglang.Engine(**kwargs)`` (``ServerArgs`` fields only).

    Args:
        model_path: resolved HF folder.
        rollout: the rollout section (verl names).
        options: the validated :class:`~verl_sglang.options.SGLangRolloutOptions`.
        fields: the installed ``ServerArgs`` field names; optional settings a sglang lacks are not passed.
        device_kind: ``cuda``, ``npu`` or ``cpu`` (SGLang's ``device``).
        base_gpu_id: the device ordinal of the group's first rank.
        tp_size: ranks (GPUs) of this engine.
        context: :func:`context_length`.
        port: the engine's port (``options.port`` or a free one).
        trust_remote_code: ``model.trust_remote_code``.
        model_overrides: ``model.override_config`` attribute overrides (``json_model_override_args``).
        hip: torch is a ROCm build.
        sglang_version: the installed version (the attention default depends on it).

    Raises:
        ValueError: the installed ``ServerArgs`` lacks a field this plugin needs (:data:`REQUIRED_FIELDS`) or one
            the arguments name; an option conflicts with a rollout key (``chunked_prefill_size`` with
            ``enable_chunked_prefill=false``); a rollout key :func:`~verl_sglang.rollout_keys.rollout_server_args`
            refuses.
    """
    names = frozenset(fields)
    missing = [name for name in REQUIRED_FIELDS if name not in names]
    if missing:
        raise ValueError(
            f"rollout engine 'sglang': the installed sglang's ServerArgs has no {missing}; install a supported sglang "
            "(pip install './plugins/verl-sglang[cuda]')"
        )
    args: dict[str, Any] = {
        "model_path": str(model_path),
        "skip_tokenizer_init": True,
        "tp_size": int(tp_size),
        "dtype": engine_dtype(rollout, device_kind),
        "device": device_kind,
        "base_gpu_id": int(base_gpu_id),
        "gpu_id_step": 1,
        # sleep()/wake_up() go through torch_memory_saver, a CUDA/NPU allocator hook; a cpu engine keeps host memory.
        "enable_memory_saver": device_kind != "cpu",
        "context_length": int(context),
        "trust_remote_code": bool(trust_remote_code),
        "log_level": options.log_level,
        "port": int(port),
        **rollout_server_args(rollout, names),
    }
    if model_overrides:
        args["json_model_override_args"] = json.dumps(dict(model_overrides))
    if "enable_weights_cpu_backup" in names:
        args["enable_weights_cpu_backup"] = bool(options.enable_weights_cpu_backup)
    backend = attention_backend(
        options.attention_backend, device_kind=device_kind, hip=hip, sglang_version=sglang_version
    )
    if backend is not None:
        args["attention_backend"] = backend
    extra = passthrough_arguments(options)
    # Only chunked_prefill_size can collide (every other value set above is refused as an option): the rollout
    # key's -1 and a chunk size cannot both hold.
    clash = sorted(set(extra) & set(args))
    if clash:
        name = clash[0]
        source = {"chunked_prefill_size": f"{ROLLOUT}.enable_chunked_prefill=false"}.get(name, "the rollout keys")
        raise ValueError(
            f"rollout engine 'sglang': engine_kwargs.sglang.{name}={extra[name]!r} conflicts with {name}="
            f"{args[name]!r}, set from {source}; remove one of them"
        )
    args.update(extra)
    unknown = sorted(set(args) - names)
    if unknown:
        raise ValueError(f"rollout engine 'sglang': the installed sglang's ServerArgs has no {unknown}")
    return args
