"""verl's first-class rollout keys (``actor_rollout_ref.rollout.<key>``) as SGLang ``ServerArgs`` values.

verl's SGLang server maps a few rollout keys to ``ServerArgs`` (``async_sglang_server.py``: ``dtype``,
``mem_fraction_static``, ``disable_cuda_graph``, ``tp_size``, ``load_format``, ``max_running_requests``); this
plugin maps every engine key core accepts, or refuses it at config load with the reason (:func:`check_config`):

| rollout key | SGLang | note |
|---|---|---|
| gpu_memory_utilization | ``mem_fraction_static`` | null = 0.5 (verl's ``rollout.yaml`` value; it leaves room for the trainer) |
| enforce_eager | ``disable_cuda_graph`` | null = SGLang's default (CUDA graphs on) |
| max_num_seqs | ``max_running_requests`` | |
| max_num_batched_tokens | ``max_prefill_tokens`` | SGLang's token budget of one prefill batch (verl passes nothing) |
| max_model_len | ``context_length`` = value + 2 | see :func:`verl_sglang.server_args.context_length` |
| enable_prefix_caching | ``disable_radix_cache`` = not value | |
| enable_chunked_prefill | false: ``chunked_prefill_size=-1``; true: SGLang's size | with false, ``engine_kwargs.sglang.chunked_prefill_size`` is refused |
| cudagraph_capture_sizes | ``cuda_graph_bs`` (sglang < 0.5.2x) / ``cuda_graph_bs_decode`` | refused with ``enforce_eager=true`` |
| load_format | ``load_format``: auto/hf -> auto, safetensors | |
| seed | ``random_seed`` | |
| ignore_eos | ``SamplingParams.ignore_eos`` | per request |
| disable_log_stats | true only | SGLang has no statistics switch: false is refused, use ``engine_kwargs.sglang.log_level=info`` |
| multi_stage_wake_up | none: verl reads it nowhere | the wake-up is always weights, sync, then KV cache (two resume calls), verl's order; both values are accepted |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLLOUT = "actor_rollout_ref.rollout"
#: rollout.load_format -> SGLang's load_format.
LOAD_FORMATS = {"auto": "auto", "hf": "auto", "safetensors": "safetensors"}
#: mem_fraction_static when rollout.gpu_memory_utilization is null.
DEFAULT_MEMORY_FRACTION = 0.5


def _sglang_kwargs(rollout: Any) -> Mapping[str, Any]:
    raw = (getattr(rollout, "engine_kwargs", None) or {}).get("sglang", {}) or {}
    return raw if isinstance(raw, Mapping) else {}


def check_config(rollout: Any) -> list[tuple[str, str]]:
    """``(dotted key, message)`` for rollout keys the ``sglang`` engine cannot take (the spec's ``check_config``).

    Import-light (no torch, no sglang): runs at config load, before anything is built.
    """
    problems: list[tuple[str, str]] = []
    if getattr(rollout, "disable_log_stats", True) is False:
        problems.append(
            (
                f"{ROLLOUT}.disable_log_stats",
                "=false: rollout engine 'sglang' has no statistics switch to turn on (SGLang logs its decode "
                "throughput at log level info); remove the key and set "
                f"{ROLLOUT}.engine_kwargs.sglang.log_level=info",
            )
        )
    fmt = getattr(rollout, "load_format", "auto")
    if fmt not in LOAD_FORMATS:
        problems.append(
            (f"{ROLLOUT}.load_format", f"={fmt!r}: rollout engine 'sglang' loads with {sorted(LOAD_FORMATS)}")
        )
    if getattr(rollout, "enforce_eager", None) and getattr(rollout, "cudagraph_capture_sizes", None):
        problems.append(
            (
                f"{ROLLOUT}.cudagraph_capture_sizes",
                f"chooses the batch sizes SGLang captures as CUDA graphs, but {ROLLOUT}.enforce_eager=true turns "
                "CUDA graphs off (disable_cuda_graph); remove one of them",
            )
        )
    graphs = sorted(k for k, v in _sglang_kwargs(rollout).items() if k.startswith("cuda_graph") and v is not None)
    if getattr(rollout, "enforce_eager", None) and graphs:
        # SGLang applies its cuda_graph_* fields after the legacy disable_cuda_graph switch: they would win.
        problems.append(
            (
                f"{ROLLOUT}.engine_kwargs.sglang.{graphs[0]}",
                f"configures CUDA graphs ({', '.join(graphs)}), but {ROLLOUT}.enforce_eager=true turns them off "
                "(disable_cuda_graph), and SGLang would let these fields switch them back on; remove one of them",
            )
        )
    chunk = _sglang_kwargs(rollout).get("chunked_prefill_size")
    if getattr(rollout, "enable_chunked_prefill", None) is False and chunk is not None:
        problems.append(
            (
                f"{ROLLOUT}.enable_chunked_prefill",
                f"=false turns chunked prefill off (chunked_prefill_size=-1), but {ROLLOUT}.engine_kwargs.sglang."
                "chunked_prefill_size sets a chunk size; remove one of them",
            )
        )
    return problems


def load_format(rollout: Any) -> str:
    """SGLang's ``load_format`` for ``rollout.load_format`` (``auto`` when unset).

    Raises:
        ValueError: a format SGLang cannot read a HF checkpoint with (e.g. ``dummy``).
    """
    fmt = getattr(rollout, "load_format", None) or "auto"
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"{ROLLOUT}.load_format={fmt!r}: rollout engine 'sglang' loads with {sorted(LOAD_FORMATS)}")
    return LOAD_FORMATS[fmt]


def rollout_server_args(rollout: Any, fields: frozenset[str] | set[str]) -> dict[str, Any]:
    """``ServerArgs`` values of the rollout keys in the table above (``context_length`` excepted: it needs the
    model, :func:`verl_sglang.server_args.context_length`), only for keys that are set.

    Args:
        rollout: the rollout section (verl names, read with ``getattr``).
        fields: the installed ``ServerArgs`` field names (the CUDA-graph batch sizes changed name).

    Raises:
        ValueError: ``cudagraph_capture_sizes`` set but this sglang has neither of its fields; a ``load_format``
            SGLang cannot read a HF checkpoint with (:func:`load_format`).
    """
    memory = getattr(rollout, "gpu_memory_utilization", None)
    out: dict[str, Any] = {
        "mem_fraction_static": float(memory if memory is not None else DEFAULT_MEMORY_FRACTION),
        "load_format": load_format(rollout),
        "random_seed": int(getattr(rollout, "seed", 0) or 0),
    }
    eager = getattr(rollout, "enforce_eager", None)
    if eager is not None:
        out["disable_cuda_graph"] = bool(eager)
    for key, arg in (("max_num_seqs", "max_running_requests"), ("max_num_batched_tokens", "max_prefill_tokens")):
        value = getattr(rollout, key, None)
        if value is not None:
            out[arg] = int(value)
    prefix = getattr(rollout, "enable_prefix_caching", None)
    if prefix is not None:
        out["disable_radix_cache"] = not bool(prefix)
    if getattr(rollout, "enable_chunked_prefill", None) is False:
        out["chunked_prefill_size"] = -1
    sizes = getattr(rollout, "cudagraph_capture_sizes", None)
    if sizes:
        arg = next((name for name in ("cuda_graph_bs", "cuda_graph_bs_decode") if name in fields), None)
        if arg is None:
            raise ValueError(
                f"{ROLLOUT}.cudagraph_capture_sizes: the installed sglang's ServerArgs has neither cuda_graph_bs nor "
                "cuda_graph_bs_decode; remove the key"
            )
        out[arg] = [int(s) for s in sizes]
    return out
