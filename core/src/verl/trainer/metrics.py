"""Per-step metrics computed from the final batch, with verl's names and formulas (anatomy §3.6).

Follows ``verl/trainer/ppo/metric_utils.py`` (``compute_data_metrics``, ``compute_timing_metrics``,
``compute_throughout_metrics`` — spelled ``throughput`` here) and ``verl/utils/metric/utils.py``
(``reduce_metrics``), plus the ``marked_timer`` that fills ``timing_raw`` (``verl/utils/profiler``).
Every value returned is a python ``float`` (``int`` for token counts) so it can go straight to a logger.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

# stages normalised per token in timing_per_token_ms/* (verl's list): gen by response tokens, the rest by all
_PER_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor")

_PRODUCERS = {
    "responses": "rollout (generate_sequences)",
    "attention_mask": "the dataset + rollout",
    "token_level_scores": "the reward step",
    "token_level_rewards": "the adv step (token_level_scores, minus KL when use_kl_in_reward)",
    "advantages": "compute_advantage",
    "returns": "compute_advantage",
    "values": "the critic (compute_values); pass use_critic=False without a critic",
}


def _get(batch: Any, key: str) -> torch.Tensor:
    tensors = getattr(batch, "batch", None)
    if tensors is None or key not in tensors.keys():
        present = [] if tensors is None else sorted(tensors.keys())
        raise KeyError(f"metrics need batch[{key!r}] (produced by {_PRODUCERS.get(key, '?')}); present: {present}")
    return tensors[key]


def _response_info(batch: Any) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(prompt_length (bs,) float, response_length (bs,) float, max prompt width, max response width)."""
    response_width = _get(batch, "responses").shape[-1]
    attention_mask = _get(batch, "attention_mask")
    prompt_width = attention_mask.shape[-1] - response_width
    prompt_length = attention_mask[:, :prompt_width].sum(-1).float()
    response_length = attention_mask[:, prompt_width:].sum(-1).float()
    return prompt_length, response_length, prompt_width, response_width


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``{prefix}/mean, /max, /min`` of a flat tensor; NaN for an empty one (e.g. every row aborted)."""
    if values.numel() == 0:
        return {f"{prefix}/mean": math.nan, f"{prefix}/max": math.nan, f"{prefix}/min": math.nan}
    values = values.detach()
    if not values.is_floating_point():
        values = values.double()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _clip_ratio(lengths: torch.Tensor, width: int) -> float:
    return torch.eq(lengths, width).float().mean().item() if lengths.numel() else math.nan


def compute_data_metrics(batch: Any, use_critic: bool = False) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of one step (verl metric_utils).

    Args:
        batch: DataProto with ``responses`` (bs, R), ``attention_mask`` (bs, P+R), ``token_level_scores``,
            ``token_level_rewards``, ``advantages``, ``returns`` (bs, R) float, optional ``response_mask`` (bs, R)
            (default: the response part of ``attention_mask``), and ``values`` (bs, R) when ``use_critic``.
            ``non_tensor_batch["__num_turns__"]`` (bs,) adds ``num_turns/{min,max,mean}``.
        use_critic: add ``critic/values/*`` and ``critic/vf_explained_var``.

    Returns:
        ``critic/score/{mean,max,min}`` and ``critic/rewards/*``: per-sequence sums of token_level_scores /
        token_level_rewards over non-aborted rows (response length > 0); ``critic/advantages/*``,
        ``critic/returns/*`` (and ``critic/values/*``): over response tokens where ``response_mask`` is 1;
        ``critic/vf_explained_var = 1 - Var(R - V) / (Var(R) + 1e-5)`` (unbiased variances, masked tokens);
        ``response_length/{mean,max,min,clip_ratio}`` (clip_ratio = fraction of rows at the full response
        width), the same over non-aborted rows as ``response_length_non_aborted/*``, ``response/aborted_ratio``,
        and ``prompt_length/{mean,max,min,clip_ratio}`` (at the full prompt width).

    Raises:
        KeyError: a required tensor is missing (the message names it and the stage that produces it).
    """
    prompt_length, response_length, prompt_width, response_width = _response_info(batch)
    tensors = batch.batch
    if "response_mask" in tensors.keys():
        response_mask = tensors["response_mask"].bool()
    else:
        response_mask = tensors["attention_mask"][:, -response_width:].bool()
    non_aborted = response_length > 0

    sequence_score = _get(batch, "token_level_scores").sum(-1)[non_aborted]
    sequence_reward = _get(batch, "token_level_rewards").sum(-1)[non_aborted]
    valid_adv = torch.masked_select(_get(batch, "advantages"), response_mask)
    valid_returns = torch.masked_select(_get(batch, "returns"), response_mask)

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", sequence_score))
    metrics.update(_stats("critic/rewards", sequence_reward))
    metrics.update(_stats("critic/advantages", valid_adv))
    metrics.update(_stats("critic/returns", valid_returns))
    if use_critic:
        valid_values = torch.masked_select(_get(batch, "values"), response_mask)
        metrics.update(_stats("critic/values", valid_values))
        if valid_returns.numel() > 1:
            diff_var = torch.var(valid_returns.float() - valid_values.float())
            metrics["critic/vf_explained_var"] = (1.0 - diff_var / (torch.var(valid_returns.float()) + 1e-5)).item()
        else:
            metrics["critic/vf_explained_var"] = math.nan

    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = _clip_ratio(response_length, response_width)
    kept = response_length[non_aborted]
    metrics.update(_stats("response_length_non_aborted", kept))
    metrics["response_length_non_aborted/clip_ratio"] = _clip_ratio(kept, response_width)
    metrics["response/aborted_ratio"] = (~non_aborted).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = _clip_ratio(prompt_length, prompt_width)

    turns = getattr(batch, "non_tensor_batch", {}).get("__num_turns__")
    if turns is not None:
        metrics.update(_stats("num_turns", torch.as_tensor(np.asarray(turns, dtype=np.float64))))
    return metrics


def compute_timing_metrics(batch: Any, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every timed stage and ``timing_per_token_ms/<stage>`` (verl metric_utils).

    Per-token milliseconds: ``gen`` divided by the number of response tokens, ``ref``, ``values``, ``adv``,
    ``update_critic`` and ``update_actor`` by all (prompt + response) tokens, counted from ``attention_mask``;
    other stages (``step``, ``reward``, ``save_checkpoint``, ...) only get ``timing_s``. Stages over zero
    tokens get no per-token value.

    Args:
        timing_raw: ``{stage: seconds}`` as filled by :func:`marked_timer`.
    """
    prompt_length, response_length, _, _ = _response_info(batch)
    response_tokens = response_length.sum().item()
    all_tokens = prompt_length.sum().item() + response_tokens
    tokens = {"gen": response_tokens, **dict.fromkeys(_PER_TOKEN_STAGES, all_tokens)}
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for name, seconds in timing_raw.items():
        if tokens.get(name):
            metrics[f"timing_per_token_ms/{name}"] = float(seconds) * 1000.0 / tokens[name]
    return metrics


def compute_throughput_metrics(batch: Any, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens``, ``perf/time_per_step`` (s), ``perf/throughput`` (tokens/s per device).

    ``throughput = total_num_tokens / (timing_raw["step"] * n_gpus)`` (verl ``compute_throughout_metrics``).
    Tokens: ``sum(meta_info["global_token_num"])`` (per-row attention sums set by the trainer), else the sum
    of ``attention_mask``.

    Raises:
        KeyError: ``timing_raw`` has no ``"step"``. ValueError: ``n_gpus < 1``.
    """
    if "step" not in timing_raw:
        raise KeyError(
            f"throughput needs timing_raw['step'] (wrap the step in marked_timer('step', ...)); got {sorted(timing_raw)}"
        )
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    per_row = getattr(batch, "meta_info", {}).get("global_token_num")
    total = int(sum(per_row)) if per_row is not None else int(_get(batch, "attention_mask").sum().item())
    step_time = float(timing_raw["step"])
    throughput = total / (step_time * n_gpus) if step_time > 0 else math.nan
    return {"perf/total_num_tokens": total, "perf/time_per_step": step_time, "perf/throughput": throughput}


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Reduce ``{name: list of values}`` (e.g. one per micro-batch) to one float per name (verl rule).

    ``max`` when "max" is in the name, else ``min`` when "min" is in it, else the mean. A scalar passes
    through as a float; an empty list gives NaN. Tensors are read with ``.item()``.
    """
    out: dict[str, float] = {}
    for key, values in metrics.items():
        if not isinstance(values, (list, tuple, np.ndarray, torch.Tensor)) or (
            isinstance(values, (np.ndarray, torch.Tensor)) and values.ndim == 0
        ):
            out[key] = float(values)
            continue
        flat = np.asarray([float(v) for v in values], dtype=np.float64)
        if flat.size == 0:
            out[key] = math.nan
        elif "max" in key:
            out[key] = float(flat.max())
        elif "min" in key:
            out[key] = float(flat.min())
        else:
            out[key] = float(flat.mean())
    return out


class Timer:
    """Wall-clock stopwatch (``time.perf_counter``): ``with Timer() as t: ...`` then ``t.last`` seconds.

    ``total`` accumulates over every use of the same Timer.
    """

    def __init__(self, name: str | None = None):
        self.name = name
        self.last = 0.0
        self.total = 0.0
        self._start: float | None = None

    def __enter__(self) -> Timer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.last = time.perf_counter() - (self._start or 0.0)
        self.total += self.last
        self._start = None


@contextmanager
def marked_timer(name: str, timing_raw: dict[str, float]) -> Iterator[Timer]:
    """Time the block and add its seconds to ``timing_raw[name]`` (accumulating, as verl's ``_timer``).

    The time is recorded even when the block raises, so a failed step still shows where it spent its time.
    """
    timer = Timer(name)
    try:
        with timer:
            yield timer
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + timer.last
