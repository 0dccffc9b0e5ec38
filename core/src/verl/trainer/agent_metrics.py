"""Step metrics of agent-loop rollouts (``rollout.mode=async``), from the per-sample columns of the batch.

verl's names where it has them (``verl/trainer/ppo/metric_utils.py``, ``agent_loop.py:_performance_metrics``):
``num_turns/{min,max,mean}``, ``tool_call_counts/{min,max,mean}``, ``agent_loop/generate_sequences/*`` and
``agent_loop/tool_calls/*`` (seconds per sample). Ours for the failures a tool run must show: ``tool/calls``,
``tool/errors``, ``tool/parse_errors``, ``tool/timeouts``, ``tool/truncated`` (totals over the step's samples),
``tool/call_rate`` (share of samples with at least one call), ``tool/tokenization_mismatch`` (share of samples
whose turn-by-turn ids differ from the chat template's rendering) and ``agent_loop/tool_token_ratio`` (share of
response tokens that are tool / interaction tokens, mask 0). Empty for a sync rollout (no such columns).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {
        f"{prefix}/min": float(values.min()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/mean": float(values.mean()),
    }


def compute_agent_metrics(batch: Any) -> dict[str, float]:
    """The metrics above for ``batch`` (a DataProto after the rollout), or ``{}`` without agent columns."""
    cols = batch.non_tensor_batch
    if "__num_turns__" not in cols or len(batch) == 0:
        return {}
    out = _stats("num_turns", np.asarray(cols["__num_turns__"], dtype=np.float64))

    def col(name: str) -> np.ndarray | None:
        return np.asarray(cols[name], dtype=np.float64) if name in cols else None

    calls = col("__tool_calls__")
    if calls is not None:
        out.update(_stats("tool_call_counts", calls))
        out["tool/calls"] = float(calls.sum())
        out["tool/call_rate"] = float((calls > 0).mean())
    for name, key in (
        ("__tool_errors__", "tool/errors"),
        ("__tool_parse_errors__", "tool/parse_errors"),
        ("__tool_timeouts__", "tool/timeouts"),
        ("__tool_truncated__", "tool/truncated"),
    ):
        values = col(name)
        if values is not None:
            out[key] = float(values.sum())
    mismatch = col("__tokenization_mismatch__")
    if mismatch is not None:
        out["tool/tokenization_mismatch"] = float(mismatch.mean())
    for name, prefix in (
        ("__agent_generate_s__", "agent_loop/generate_sequences"),
        ("__agent_tool_s__", "agent_loop/tool_calls"),
    ):
        values = col(name)
        if values is not None:
            out.update(_stats(prefix, values))
    tensors = batch.batch
    if "response_mask" in tensors.keys() and "attention_mask" in tensors.keys():
        width = tensors["response_mask"].shape[1]
        attended = float(tensors["attention_mask"][:, -width:].sum())
        if attended > 0:
            out["agent_loop/tool_token_ratio"] = 1.0 - float(tensors["response_mask"].sum()) / attended
    return out


__all__ = ["compute_agent_metrics"]
