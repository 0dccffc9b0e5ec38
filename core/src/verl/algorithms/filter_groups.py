"""DAPO's dynamic sampling: drop the prompt groups whose metric has no spread, collect kept groups to a batch.

Source: verl ``recipe/dapo/dapo_ray_trainer.py`` (``RayDAPOTrainer.fit``, the last copy in verl is at the parent
of commit 2bb42bae6, before the recipe moved to verl-recipe) and ``FilterGroupsConfig`` in
``verl/trainer/config/algorithm.py``. verl's loop, per generation round of ``data.gen_batch_size`` prompts:

1. the metric of every response: ``seq_reward`` = ``token_level_scores.sum(-1)``, ``seq_final_reward`` =
   ``token_level_rewards.sum(-1)`` (after the in-reward KL), any other name = that key of the reward's extra
   info (``acc``, ``score``, ... what ``compute_score`` returned);
2. a group (rows sharing a ``uid``) is kept when ``np.std`` of its values is > 0 or it has one row;
3. kept rows are appended to the step's batch; with fewer than ``data.train_batch_size`` kept groups the
   next round runs, unless ``max_num_gen_batches`` (> 0) rounds were used: then ``ValueError``;
4. with enough, the batch is cut to its first ``train_batch_size * rollout.n`` rows (the first
   ``train_batch_size`` groups: rows of a group are contiguous) and trained on.

Deviation: "no spread" is tested as max == min of the group's values rather than ``np.std(...) == 0``, which
is the same in exact arithmetic but in floating point gives e.g. ``np.std([0.1, 0.1, 0.1]) > 0``: verl would
keep that group although its responses scored the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "SEQUENCE_METRICS",
    "DynamicSamplingError",
    "GroupFilter",
    "group_metric_values",
    "kept_group_uids",
]

#: Metrics computed from the batch's tensors; every other name is read from the reward's extra info.
SEQUENCE_METRICS = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_rewards"}
#: The trainer keeps compute_score's extra keys as ``non_tensor_batch["reward_extra/<key>"]``; verl as the bare
#: key. Both are read (as gdpo does, :mod:`verl.algorithms.advantage_gdpo`).
REWARD_EXTRA_PREFIX = "reward_extra/"
METRIC_KEY = "algorithm.filter_groups.metric"
ROUNDS_KEY = "algorithm.filter_groups.max_num_gen_batches"


class DynamicSamplingError(ValueError):
    """Group filtering cannot go on: the metric is missing or not numeric, or the round limit was reached."""


def group_metric_values(batch: Any, metric: str) -> np.ndarray:
    """The filter metric of every row of ``batch``, ``(bs,)`` float64.

    Args:
        batch: a DataProto with ``batch["token_level_scores"]`` / ``["token_level_rewards"]`` ``(bs, resp_len)``
            float for the ``seq_*`` metrics, else ``non_tensor_batch[metric]`` or
            ``non_tensor_batch["reward_extra/" + metric]`` (one number or bool per row).
        metric: ``algorithm.filter_groups.metric``.

    Raises:
        DynamicSamplingError: the metric is in neither place (the message lists the metrics this batch has),
            or a row's value is not a finite number (e.g. None where ``compute_score``'s dict lacked the key).
    """
    tensors = getattr(batch, "batch", None)
    if metric in SEQUENCE_METRICS:
        key = SEQUENCE_METRICS[metric]
        if tensors is None or key not in tensors.keys():
            raise DynamicSamplingError(f"{METRIC_KEY}={metric!r} sums batch[{key!r}], which this batch lacks")
        sums = tensors[key].detach().sum(-1).double().cpu().numpy()
        bad = np.flatnonzero(~np.isfinite(sums))
        if bad.size:
            # verl's np.std > 0 drops a group holding NaN by accident; refuse instead of guessing.
            raise DynamicSamplingError(
                f"{METRIC_KEY}={metric!r}: rows {bad[:8].tolist()} sum {key} to a non-finite value; every "
                "response needs a finite reward"
            )
        return sums
    non_tensor: Mapping[str, Any] = batch.non_tensor_batch
    for name in (metric, f"{REWARD_EXTRA_PREFIX}{metric}"):
        if name in non_tensor:
            return _as_numbers(non_tensor[name], metric)
    extra = sorted(k.removeprefix(REWARD_EXTRA_PREFIX) for k in non_tensor if k.startswith(REWARD_EXTRA_PREFIX))
    raise DynamicSamplingError(
        f"{METRIC_KEY}={metric!r} is not a key of the reward's extra info (this batch has {extra}); use one of "
        f"{sorted(SEQUENCE_METRICS)} or a key compute_score returns in its dict (a float result is logged as 'acc')"
    )


def _as_numbers(values: np.ndarray, metric: str) -> np.ndarray:
    out = np.empty(len(values), dtype=np.float64)
    for row, value in enumerate(values):
        # Numbers only: float("7") would pass a string prediction (e.g. a 'pred' key) off as a score.
        out[row] = float(value) if isinstance(value, int | float | np.number | np.bool_) else np.nan
        if not np.isfinite(out[row]):
            raise DynamicSamplingError(
                f"{METRIC_KEY}={metric!r}: row {row} holds {value!r}, not a finite number; every response needs one "
                "(compute_score's dict lacked the key, or a failed sample has none: 'score' and 'acc' are always set)"
            )
    return out


def kept_group_uids(uids: Sequence[Any], values: Sequence[float]) -> tuple[list[Any], list[Any]]:
    """Split the groups of one round into kept and dropped, each in order of first appearance.

    Args:
        uids: ``(bs,)`` group id per row (``non_tensor_batch["uid"]``).
        values: ``(bs,)`` the metric per row (:func:`group_metric_values`).

    Returns:
        ``(kept, dropped)`` uid lists: a group is kept when its values are not all equal, or it has one row
        (verl keeps those: a single response has no spread to measure).

    Raises:
        ValueError: ``uids`` and ``values`` differ in length.
    """
    if len(uids) != len(values):
        raise ValueError(f"kept_group_uids: {len(uids)} uids but {len(values)} metric values")
    groups: dict[Any, list[float]] = {}
    for uid, value in zip(uids, values, strict=True):
        groups.setdefault(uid, []).append(float(value))
    kept = [uid for uid, vals in groups.items() if len(vals) == 1 or max(vals) != min(vals)]
    kept_set = set(kept)
    return kept, [uid for uid in groups if uid not in kept_set]


class GroupFilter:
    """The state of one step's generation rounds: kept rows, round and group counts (verl's DAPO loop).

    Args:
        metric: ``algorithm.filter_groups.metric``.
        train_batch_size: groups the step trains on (``data.train_batch_size``).
        max_num_gen_batches: rounds allowed per step; <= 0 = no limit (verl).

    Use: :meth:`add` each round's scored batch; while not :attr:`ready`, :meth:`check_budget` (raises at the
    limit) and run another round; then :meth:`take` the batch and :meth:`metrics`.
    """

    def __init__(self, metric: str, train_batch_size: int, max_num_gen_batches: int = 0) -> None:
        if train_batch_size < 1:
            raise ValueError(f"train_batch_size must be >= 1, got {train_batch_size}")
        self.metric = metric
        self.train_batch_size = int(train_batch_size)
        self.max_num_gen_batches = int(max_num_gen_batches)
        self.num_gen_batches = 0
        self.kept_uids: list[Any] = []
        self.dropped = 0
        self._parts: list[Any] = []
        # Sum/count of the metric over every generated response: the trained batch's own scores are selected
        # (groups with spread only), so this is the unbiased picture of what the policy produces.
        self._metric_sum = 0.0
        self._metric_count = 0
        self._first_round_mean = float("nan")

    @property
    def ready(self) -> bool:
        """At least ``train_batch_size`` groups kept."""
        return len(self.kept_uids) >= self.train_batch_size

    def add(self, batch: Any) -> None:
        """Count one round and keep the rows of its groups with spread.

        Args:
            batch: the round's scored DataProto with ``non_tensor_batch["uid"]`` (a group's rows contiguous, as
                ``repeat(n, interleave=True)`` leaves them) and the metric (:func:`group_metric_values`).

        Raises:
            DynamicSamplingError: as :func:`group_metric_values`.
        """
        self.num_gen_batches += 1
        uids = batch.non_tensor_batch["uid"]
        values = group_metric_values(batch, self.metric)
        kept, dropped = kept_group_uids(uids, values)
        self.dropped += len(dropped)
        if self.num_gen_batches == 1 and len(values):
            self._first_round_mean = float(values.mean())
        self._metric_sum += float(values.sum())
        self._metric_count += len(values)
        self.kept_uids += kept
        if kept:
            kept_set = set(kept)
            self._parts.append(batch.select_idxs(np.array([uid in kept_set for uid in uids], dtype=bool)))

    def check_budget(self) -> None:
        """Raise when another round is needed but ``max_num_gen_batches`` (> 0) rounds were used.

        Raises:
            DynamicSamplingError: verl's message (too many rounds: check the data or raise the limit).
        """
        limit = self.max_num_gen_batches
        if not self.ready and 0 < limit <= self.num_gen_batches:
            raise DynamicSamplingError(
                f"num_gen_batches={self.num_gen_batches} >= {ROUNDS_KEY}={limit}: only {len(self.kept_uids)} of "
                f"data.train_batch_size={self.train_batch_size} groups had responses with different "
                f"{METRIC_KEY}={self.metric!r} ({self.dropped} dropped). Generated too many; check whether the data "
                f"are too difficult (or too easy), raise {ROUNDS_KEY}, or set it to 0 for no limit"
            )

    def take(self) -> Any:
        """The step's batch: the rows of the first ``train_batch_size`` kept groups, in the order generated.

        Parts are concatenated with the first round's ``meta_info`` (the rounds' per-call keys, e.g. timings,
        would otherwise conflict); a non-tensor column some rounds lack (an extra-info key no sample of that
        round reported) is filled with None there.

        Raises:
            RuntimeError: called before :attr:`ready`.
        """
        from verl.protocol import DataProto

        if not self.ready:
            raise RuntimeError(f"take() needs {self.train_batch_size} kept groups, has {len(self.kept_uids)}")
        columns = list(dict.fromkeys(key for part in self._parts for key in part.non_tensor_batch))
        parts = []
        for part in self._parts:
            filled = {key: part.non_tensor_batch.get(key, np.full(len(part), None, dtype=object)) for key in columns}
            parts.append(DataProto(batch=part.batch, non_tensor_batch=filled, meta_info={}))
        merged = DataProto.concat(parts) if len(parts) > 1 else parts[0]
        merged.meta_info = dict(self._parts[0].meta_info)
        chosen = set(self.kept_uids[: self.train_batch_size])
        if len(self.kept_uids) == self.train_batch_size:
            return merged
        return merged.select_idxs(np.array([uid in chosen for uid in merged.non_tensor_batch["uid"]], dtype=bool))

    def metrics(self) -> dict[str, float]:
        """``train/num_gen_batches`` (verl's name), group counts and the metric before the filter.

        ``train/filter_groups/kept`` (groups with spread, over all rounds), ``/dropped`` (without), ``/surplus``
        (kept beyond ``train_batch_size``, cut); ``/metric_mean``: the filter metric's mean over every response
        generated in the step's rounds, ``/metric_mean_first_round``: over the first round's only (one loader
        batch, the sample an unfiltered step would have trained on). Not verl metrics: the trained batch's
        ``critic/score/*`` describe selected groups only, so these are what compares with an unfiltered run.
        """
        mean = self._metric_sum / self._metric_count if self._metric_count else float("nan")
        return {
            "train/num_gen_batches": self.num_gen_batches,
            "train/filter_groups/kept": len(self.kept_uids),
            "train/filter_groups/dropped": self.dropped,
            "train/filter_groups/surplus": max(0, len(self.kept_uids) - self.train_batch_size),
            "train/filter_groups/metric_mean": mean,
            "train/filter_groups/metric_mean_first_round": self._first_round_mean,
        }
