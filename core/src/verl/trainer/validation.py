"""Validation metrics with verl's names (``verl/trainer/ppo/metric_utils.py:process_validation_metrics``).

For ``N`` responses per prompt (``val_kwargs.n``), per data source:
``val-core/<data_source>/<acc|reward>/mean@N`` is the mean score over all responses. The
metric is named ``acc`` when the scorer reported accuracy (a plain float score, logged as
``acc`` by the reward manager), else ``reward``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np


def compute_validation_metrics(records: dict[str, list[Any]]) -> dict[str, float]:
    """Aggregate per-response validation records.

    Args:
        records: parallel lists ``data_source``, ``score`` (float per response), ``uid`` (prompt
            id; responses of one prompt share it) and optionally ``acc`` (float or None).

    Returns:
        ``{"val-core/<data_source>/<name>/mean@N": float, "val-aux/<data_source>/<name>/std@N": float}``
        with ``N`` the number of responses per prompt (the largest, when prompts differ).

    Raises:
        ValueError: if the lists have different lengths.
    """
    lengths = {k: len(v) for k, v in records.items() if k in ("data_source", "score", "uid")}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"validation records have different lengths: {lengths}")
    acc = records.get("acc") or [None] * len(records["score"])
    by_source: dict[str, list[float]] = defaultdict(list)
    per_prompt: dict[str, int] = defaultdict(int)
    use_acc = all(a is not None for a in acc) and len(acc) > 0
    for source, score, a, uid in zip(records["data_source"], records["score"], acc, records["uid"], strict=True):
        by_source[str(source)].append(float(a) if use_acc else float(score))
        per_prompt[uid] += 1
    n = max(per_prompt.values(), default=1)
    name = "acc" if use_acc else "reward"
    out: dict[str, float] = {}
    for source, values in by_source.items():
        arr = np.asarray(values, dtype=np.float64)
        out[f"val-core/{source}/{name}/mean@{n}"] = float(arr.mean())
        out[f"val-aux/{source}/{name}/std@{n}"] = float(arr.std())
    return out
