"""``engine_kwargs.vllm`` options that go to ``vllm.LLM(...)`` unchanged, and where vLLM would not honour them.

verl's vLLM server (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) passes every
``rollout.engine_kwargs.vllm.*`` entry to vLLM's engine arguments; its scripts use ``compilation_config``,
``kv_cache_dtype``, ``async_scheduling`` and ``additional_config``. Here each is a
:class:`~verl_vllm.options.VLLMRolloutOptions` option, so a typo still fails at load, and each is passed under
vLLM's name (``vllm.engine.arg_utils.EngineArgs``).

``compilation_config`` is built as verl builds it: the mapping from ``engine_kwargs`` with
``rollout.cudagraph_capture_sizes`` laid over it. verl lets the rollout key win silently; here setting
``cudagraph_capture_sizes`` both ways is an error naming both keys (which one was meant is a guess).

What vLLM 0.32 silently overrides is refused before the engine starts, with the reason:

* on cpu (``vllm/platforms/cpu.py``): CUDA-graph fields of ``compilation_config`` (no CUDA graphs; the platform
  empties ``cudagraph_capture_sizes``), ``async_scheduling=true`` (the platform turns it off), and a
  ``kv_cache_dtype`` the CPU attention backend cannot store (``CPUAttentionBackend.supported_kv_cache_dtypes``);
* with ``enforce_eager`` (null = true on cpu): ``compilation_config.mode`` and CUDA-graph fields other than off
  (``VllmConfig`` sets ``mode`` and ``cudagraph_mode`` to NONE under eager execution).
"""

from __future__ import annotations

from typing import Any

from verl_vllm.options import VLLMRolloutOptions, parse_mapping

ROLLOUT = "actor_rollout_ref.rollout"
KWARGS = f"{ROLLOUT}.engine_kwargs.vllm"
#: KV-cache dtypes of vLLM 0.32's CPU attention backend (``CPUAttentionBackend.supported_kv_cache_dtypes``).
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
#: Values of ``compilation_config.mode`` / ``cudagraph_mode`` that mean "off" (vLLM's enums, by name or value).
_OFF = (None, 0, "NONE", "none")
#: options passed to ``vllm.LLM`` under the same name when set.
PASSTHROUGH = ("kv_cache_dtype", "async_scheduling", "additional_config")


def _raw_compilation_config(rollout: Any) -> dict[str, Any]:
    raw = (getattr(rollout, "engine_kwargs", None) or {}).get("vllm", {}) or {}
    if isinstance(raw, VLLMRolloutOptions):
        return dict(raw.compilation_config or {})
    value = raw.get("compilation_config") if hasattr(raw, "get") else None
    return parse_mapping("compilation_config", value) or {}


def both_ways_problems(rollout: Any) -> list[tuple[str, str]]:
    """``(key, message)`` when ``cudagraph_capture_sizes`` is set as a rollout key and in ``compilation_config``."""
    if getattr(rollout, "cudagraph_capture_sizes", None) and "cudagraph_capture_sizes" in _raw_compilation_config(
        rollout
    ):
        return [
            (
                f"{ROLLOUT}.cudagraph_capture_sizes",
                f"{ROLLOUT}.cudagraph_capture_sizes is also set as {KWARGS}.compilation_config.cudagraph_capture_sizes;"
                " rollout engine 'vllm' takes one of them (keep the rollout key, verl's name)",
            )
        ]
    return []


def compilation_config(rollout: Any, options: VLLMRolloutOptions) -> dict[str, Any] | None:
    """vLLM's ``compilation_config``: ``options.compilation_config`` with ``rollout.cudagraph_capture_sizes`` (as
    a list of ints) laid over it, as verl's vLLM server builds it; None when neither sets anything."""
    merged = dict(options.compilation_config or {})
    sizes = getattr(rollout, "cudagraph_capture_sizes", None)
    if sizes:
        merged["cudagraph_capture_sizes"] = [int(size) for size in sizes]
    return merged or None


def passthrough_arguments(rollout: Any, options: VLLMRolloutOptions) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of this module's options that are set (null ones are left to vLLM)."""
    out: dict[str, Any] = {name: getattr(options, name) for name in PASSTHROUGH if getattr(options, name) is not None}
    merged = compilation_config(rollout, options)
    if merged is not None:
        out["compilation_config"] = merged
    return out


def _is_cudagraph_field(name: str) -> bool:
    return "cudagraph" in name or "cuda_graph" in name


def passthrough_problems(options: VLLMRolloutOptions, device: str) -> list[str]:
    """Why these options would not do what they say on ``device`` (``cpu``/``cuda``); [] when they would.

    ``rollout.cudagraph_capture_sizes`` itself is checked by :func:`verl_vllm.rollout_keys.device_problems`.
    """
    problems = []
    eager = options.enforce_eager if options.enforce_eager is not None else device == "cpu"
    for name, value in (options.compilation_config or {}).items():
        off = name == "cudagraph_mode" and value in _OFF
        if device == "cpu" and _is_cudagraph_field(name) and not off:
            problems.append(
                f"{KWARGS}.compilation_config.{name}={value!r} configures CUDA graphs, but this engine runs on cpu, "
                "which has none (vLLM's CPU platform clears them); remove it on cpu"
            )
        elif eager and ((name == "mode" and value not in _OFF) or (_is_cudagraph_field(name) and not off)):
            problems.append(
                f"{KWARGS}.compilation_config.{name}={value!r} has no effect with enforce_eager=true "
                f"({'the cpu default' if options.enforce_eager is None else 'set'}): vLLM then turns compilation "
                f"and CUDA graphs off; set {ROLLOUT}.enforce_eager=false to use it, or remove it"
            )
    if device == "cpu":
        if options.kv_cache_dtype is not None and options.kv_cache_dtype not in CPU_KV_CACHE_DTYPES:
            problems.append(
                f"{KWARGS}.kv_cache_dtype={options.kv_cache_dtype!r}: vLLM's CPU attention backend stores the KV "
                f"cache as one of {list(CPU_KV_CACHE_DTYPES)}"
            )
        if options.async_scheduling:
            problems.append(
                f"{KWARGS}.async_scheduling=true: vLLM's CPU platform always turns asynchronous scheduling off; "
                "remove it (or set false) on cpu"
            )
    return problems
