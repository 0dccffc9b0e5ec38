"""Validation metrics with verl's names and bootstrap (``verl/trainer/ppo/metric_utils.py``).

For every data source, prompt and numeric variable (``reward`` = the response's score, plus every
numeric key the scorer reported, e.g. ``acc``), with ``n`` responses per prompt:

* ``mean@n``; with ``n > 1`` also ``std@n`` and, for ``k`` in ``2, 4, 8, ... < n`` and ``n``,
  ``best@k/{mean,std}`` / ``worst@k/{mean,std}``: the mean and spread over 1000 bootstrap draws
  (``k`` responses drawn with replacement, ``np.random.seed(42)`` as verl) of the max / min;
* ``maj@k/{mean,std}`` when the scorer reports a ``pred`` (the extracted answer): the value of the
  majority answer's first response, bootstrapped the same way.

Each is averaged over the prompts of the data source. ``val-core/<source>/<var>/<metric>`` holds
``mean@N``, ``maj@N/mean`` and ``best@N/mean`` of the core variable (``acc`` when reported, else
``reward``) for the largest ``N``; everything else is ``val-aux/...``.

Prompts are told apart by their ``uid`` (verl groups by the decoded prompt text, which merges
duplicate prompts of a data set).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

N_BOOTSTRAP = 1000
SEED = 42


def bootstrap_metric(
    data: Sequence[Any], subset_size: int, reduce_fns: Sequence[Callable[[list], float]], seed: int = SEED
) -> list[tuple[float, float]]:
    """``(mean, std)`` of each ``reduce_fn`` over :data:`N_BOOTSTRAP` draws of ``subset_size`` items.

    Draws with replacement from a ``RandomState(seed)`` (the numbers of verl's ``np.random.seed(seed)``).
    """
    rng = np.random.RandomState(seed)
    results: list[list[float]] = [[] for _ in reduce_fns]
    for _ in range(N_BOOTSTRAP):
        idx = rng.choice(len(data), size=subset_size, replace=True)
        sample = [data[i] for i in idx]
        for out, fn in zip(results, reduce_fns, strict=True):
            out.append(fn(sample))
    return [(float(np.mean(r)), float(np.std(r))) for r in results]


def calc_maj_val(data: list[dict[str, Any]], vote_key: str, val_key: str) -> float:
    """The ``val_key`` of the first item whose ``vote_key`` is the most frequent (ties: first seen)."""
    votes: dict[Any, list[Any]] = defaultdict(list)
    for item in data:
        votes[item[vote_key]].append(item[val_key])
    winner = max(votes, key=lambda k: len(votes[k]))
    return votes[winner][0]


def _sizes(n: int) -> list[int]:
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


def _prompt_metrics(values: list[float], preds: list[Any] | None, seed: int) -> dict[str, float]:
    n = len(values)
    metric = {f"mean@{n}": float(np.mean(values))}
    if n == 1:
        return metric
    metric[f"std@{n}"] = float(np.std(values))
    for k in _sizes(n):
        (best_mean, best_std), (worst_mean, worst_std) = bootstrap_metric(values, k, [np.max, np.min], seed)
        metric[f"best@{k}/mean"], metric[f"best@{k}/std"] = best_mean, best_std
        metric[f"worst@{k}/mean"], metric[f"worst@{k}/std"] = worst_mean, worst_std
        if preds is not None:
            votes = [{"val": v, "pred": p} for v, p in zip(values, preds, strict=True)]
            [(maj_mean, maj_std)] = bootstrap_metric(
                votes, k, [partial(calc_maj_val, vote_key="pred", val_key="val")], seed
            )
            metric[f"maj@{k}/mean"], metric[f"maj@{k}/std"] = maj_mean, maj_std
    return metric


def process_validation_metrics(
    data_sources: Sequence[str], uids: Sequence[str], infos: dict[str, Sequence[Any]], seed: int = SEED
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {var: {metric: value averaged over prompts}}}`` (verl's function of the same name).

    Args:
        data_sources / uids: per response, ``(num_responses,)``.
        infos: per-response values by variable name; non-numeric variables are skipped, ``pred``
            only feeds ``maj@k``.

    Raises:
        ValueError: lists of different lengths.
    """
    n = len(data_sources)
    lengths = {"uid": len(uids), **{k: len(v) for k, v in infos.items()}}
    if any(length != n for length in lengths.values()):
        raise ValueError(f"validation records have different lengths: data_source={n}, {lengths}")
    grouped: dict[str, dict[str, dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, (source, uid) in enumerate(zip(data_sources, uids, strict=True)):
        for var, values in infos.items():
            grouped[str(source)][uid][var].append(values[i])
    per_source: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for source, prompts in grouped.items():
        for var2vals in prompts.values():
            preds = var2vals.get("pred")
            for var, values in var2vals.items():
                if var == "pred" or not all(_is_number(v) for v in values):
                    continue
                metric = _prompt_metrics([float(v) for v in values], preds, seed)
                for name, value in metric.items():
                    per_source[source][var][name].append(value)
    return {
        source: {var: {name: float(np.mean(vals)) for name, vals in metrics.items()} for var, metrics in var2m.items()}
        for source, var2m in per_source.items()
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number, np.bool_))


def compute_validation_metrics(records: dict[str, list[Any]], seed: int = SEED) -> dict[str, float]:
    """verl's ``val-core`` / ``val-aux`` dict from per-response validation records.

    Args:
        records: parallel lists ``data_source``, ``uid`` (responses of one prompt share it), ``score``
            (float per response, reported as variable ``reward``) and optionally further per-response
            scorer outputs (``acc``, ``pred``, ...); ``input``/``output`` text is ignored.

    Returns:
        ``{"val-core/<source>/<var>/<metric>": float, "val-aux/...": float}`` (see the module doc).

    Raises:
        ValueError: lists of different lengths.
    """
    skip = {"data_source", "uid", "score", "input", "output"}
    infos: dict[str, Sequence[Any]] = {"reward": records["score"]}
    for key, values in records.items():
        if key not in skip and values and all(v is not None for v in values):
            infos[key] = values
    result = process_validation_metrics(records["data_source"], records["uid"], infos, seed)
    out: dict[str, float] = {}
    for source, var2metric in result.items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var, metric2val in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metric2val)
            for name, value in metric2val.items():
                core = var == core_var and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = value
    return out
