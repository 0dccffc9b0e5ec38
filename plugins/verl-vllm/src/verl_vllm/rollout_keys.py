"""verl's first-class rollout keys (``actor_rollout_ref.rollout.<key>``) mapped to vLLM's engine arguments.

verl's run scripts set vLLM's options directly on the rollout section (``rollout.gpu_memory_utilization=0.6``,
``rollout.enforce_eager=True``, ...). Each maps one to one to the ``vllm.LLM(...)`` argument of the same
name (``vllm.engine.arg_utils.EngineArgs``), through the option of the same name in
:class:`~verl_vllm.options.VLLMRolloutOptions`; null keeps that option's value (its default or
``engine_kwargs.vllm.<key>``). Setting one both ways is an error naming both keys.

| rollout key | vLLM argument | note |
|---|---|---|
| gpu_memory_utilization | ``gpu_memory_utilization`` | cuda only: on cpu the KV cache is ``kv_cache_space_gib``, so a set value is refused there |
| enforce_eager | ``enforce_eager`` | |
| enable_chunked_prefill | ``enable_chunked_prefill`` | true is refused on cpu (vLLM 0.32 crashes on a partial prefill of a seeded request) |
| enable_prefix_caching | ``enable_prefix_caching`` | |
| max_num_batched_tokens | ``max_num_batched_tokens`` | |
| max_model_len | ``max_model_len`` | |
| max_num_seqs | ``max_num_seqs`` | |
| load_format | ``load_format`` | ``auto``/``hf`` -> ``auto``, ``safetensors`` -> ``safetensors`` |
| ignore_eos | ``SamplingParams.ignore_eos`` | per request |
| disable_log_stats | ``disable_log_stats`` | verl's default true is vLLM's ``LLM`` default |
| cudagraph_capture_sizes | ``compilation_config.cudagraph_capture_sizes`` | as verl's vLLM server passes it, merged into ``engine_kwargs.vllm.compilation_config`` (:mod:`verl_vllm.engine_args`); cuda only (no CUDA graphs on cpu, refused there) |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_vllm.engine_args import both_ways_problems, passthrough_problems
from verl_vllm.options import VLLMRolloutOptions

ROLLOUT = "actor_rollout_ref.rollout"
#: rollout keys whose VLLMRolloutOptions option (and vLLM argument) has the same name.
SHARED_KEYS = (
    "gpu_memory_utilization",
    "enforce_eager",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
)
#: rollout.load_format -> vLLM's LoadConfig.load_format.
LOAD_FORMATS = {"auto": "auto", "hf": "auto", "safetensors": "safetensors"}


def _vllm_kwargs(rollout: Any) -> Mapping[str, Any]:
    raw = (getattr(rollout, "engine_kwargs", None) or {}).get("vllm", {}) or {}
    return raw if isinstance(raw, Mapping) else {}


def check_vllm_rollout_config(rollout: Any) -> list[tuple[str, str]]:
    """``(dotted key, message)`` for rollout keys the ``vllm`` engine cannot take (the spec's ``check_config``).

    A key set both as ``rollout.<key>`` and ``rollout.engine_kwargs.vllm.<key>`` is refused (which one wins
    would be a guess), so is ``cudagraph_capture_sizes`` set also in ``engine_kwargs.vllm.compilation_config``,
    and ``load_format`` must be one vLLM reads a HF checkpoint with.
    """
    raw = _vllm_kwargs(rollout)
    problems = [
        (
            f"{ROLLOUT}.{key}",
            f"{ROLLOUT}.{key} is also set as {ROLLOUT}.engine_kwargs.vllm.{key}; rollout engine 'vllm' takes one "
            "of them (keep the rollout key, verl's name)",
        )
        for key in SHARED_KEYS
        if getattr(rollout, key, None) is not None and key in raw
    ]
    problems += both_ways_problems(rollout)
    fmt = getattr(rollout, "load_format", "auto")
    if fmt not in LOAD_FORMATS:
        problems.append(
            (f"{ROLLOUT}.load_format", f"={fmt!r}: rollout engine 'vllm' loads with {sorted(LOAD_FORMATS)}")
        )
    return problems


def options_from_rollout(rollout: Any, options: VLLMRolloutOptions | None = None) -> VLLMRolloutOptions:
    """``options`` (the validated ``engine_kwargs.vllm``; None = the defaults) with the non-null rollout keys
    laid over it.

    The rollout section's ``engine_kwargs`` are not read: config load validated them into ``options`` and
    refused a key set both ways (:func:`check_vllm_rollout_config`, the spec's ``check_config``).

    Raises:
        TypeError: ``options`` is not a :class:`VLLMRolloutOptions`.
        ValueError: a bad rollout-key value.
    """
    if options is None:
        options = VLLMRolloutOptions()
    elif not isinstance(options, VLLMRolloutOptions):
        raise TypeError(
            "rollout engine 'vllm': options must be a VLLMRolloutOptions (verl.config.role_options(cfg, 'rollout', "
            f"spec)) or None, got {type(options).__name__}"
        )
    top = {key: getattr(rollout, key) for key in SHARED_KEYS if getattr(rollout, key, None) is not None}
    if not top:
        return options
    import attrs

    return attrs.evolve(options, **top)


def engine_arguments(rollout: Any) -> dict[str, Any]:
    """``vllm.LLM`` arguments of the rollout keys that have no :class:`VLLMRolloutOptions` option.

    ``disable_log_stats`` always (verl passes it to every engine). ``rollout.cudagraph_capture_sizes`` goes
    into ``compilation_config`` through :func:`verl_vllm.engine_args.compilation_config`, merged with
    ``engine_kwargs.vllm.compilation_config``.
    """
    return {"disable_log_stats": bool(getattr(rollout, "disable_log_stats", True))}


def device_problems(rollout: Any, options: VLLMRolloutOptions, device: str) -> list[str]:
    """Why these keys (and the pass-through options of :mod:`verl_vllm.engine_args`) cannot run on ``device``
    (``cpu``/``cuda``); [] when they can."""
    problems = passthrough_problems(options, device)
    if device != "cpu":
        return problems
    if getattr(rollout, "gpu_memory_utilization", None) is not None:
        problems.append(
            f"{ROLLOUT}.gpu_memory_utilization sizes vLLM's GPU memory, but this engine runs on cpu, where the KV "
            f"cache is {ROLLOUT}.engine_kwargs.vllm.kv_cache_space_gib (GiB); remove the key on cpu"
        )
    if getattr(rollout, "cudagraph_capture_sizes", None):
        problems.append(
            f"{ROLLOUT}.cudagraph_capture_sizes chooses the batch sizes vLLM captures as CUDA graphs, but this "
            "engine runs on cpu, which has none; remove the key on cpu"
        )
    if options.enable_chunked_prefill:
        problems.append(
            "enable_chunked_prefill=true cannot run on cpu: vLLM 0.32 rewinds a seeded request's generator after "
            "a partial prefill (Generator.set_offset), which CPU generators lack, and the trainer seeds every row; "
            "set it to false or null on cpu"
        )
    return problems


def load_format(rollout: Any) -> str:
    """vLLM's ``load_format`` for ``rollout.load_format`` (``auto`` when unset)."""
    fmt = getattr(rollout, "load_format", None) or "auto"
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"{ROLLOUT}.load_format={fmt!r}: rollout engine 'vllm' loads with {sorted(LOAD_FORMATS)}")
    return LOAD_FORMATS[fmt]
