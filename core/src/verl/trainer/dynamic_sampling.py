"""DAPO's dynamic sampling in the step (``algorithm.filter_groups.enable``): generation rounds until
``data.train_batch_size`` prompt groups with reward spread are kept.

One round, on one loader batch of ``data.gen_batch_size`` prompts (verl ``recipe/dapo/dapo_ray_trainer.py``)::

    uid -> gen [-> gen_max] [-> sleep -> onload -> rm] -> reward [-> old_log_prob -> ref] -> token_level_rewards
        -> filter (:class:`~verl.algorithms.filter_groups.GroupFilter`)

The bracketed switch to training runs every round only when scoring needs the training devices (a reward model,
or the in-reward KL, whose log-probs verl also computes on every round's whole batch before filtering);
otherwise the rollout stays awake through the rounds and the step switches once, after the last. Between rounds
that did switch, the step switches back to generation (the weights are unchanged, but a sleeping rollout may
have freed them). Each round takes the loader's next batch, so the loader position, saved in ``data.json``, counts
every round and a resumed run replays what an uninterrupted one generates; kept groups beyond
``train_batch_size`` are discarded with the step, as verl does. Round ``r`` samples with the step's seed plus
``r * ROUND_SEED_STRIDE`` (round 0 keeps the seed of a step without filtering).

Timing: ``timing_s/gen``, ``reward``, ... add up over the rounds (verl's accumulating ``marked_timer``).
Metrics: ``train/num_gen_batches`` (verl's name) and ``train/filter_groups/{kept,dropped,surplus}`` groups,
``train/filter_groups/metric_mean{,_first_round}`` (the metric before the filter).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from verl.trainer.metrics import marked_timer

#: Added to the rollout seed per extra round: larger than the ``2 * global_steps`` step offset can grow, so no
#: round of one step reuses another step's seed.
ROUND_SEED_STRIDE = 1_000_000_007


def gen_batch_size(cfg: Any) -> int:
    """Prompts per generation round: ``data.gen_batch_size``, or ``data.train_batch_size`` when null (verl)."""
    return int(cfg.data.gen_batch_size or cfg.data.train_batch_size)


def endless_batches(loader: Any) -> Iterator[Any]:
    """The loader's batches epoch after epoch: the rest of the current epoch, then whole epochs (the loader's
    position, hence ``data.json``, advances with every batch taken)."""
    while True:
        yield from loader


class DynamicSampling:
    """The filtered generation of :class:`~verl.trainer.step.StepStages` (a mixin: it calls the step's stages
    ``_generate``, ``_score``, ``_log_probs`` and ``_token_level_rewards`` and the mode switcher)."""

    config: Any
    switcher: Any
    rm_wg: Any
    world_size: int
    train_dataloader: Any
    _timing: dict[str, float]

    def _filtered_rollout(self, batch: Any, more_batches: Iterator[Any] | None, metrics: dict[str, Any]) -> Any:
        """Generate and score rounds until ``train_batch_size`` groups are kept; returns the training batch.

        Args:
            batch: the step's first loader batch (``gen_batch_size`` prompts).
            more_batches: where further rounds take their prompts (the trainer's loader iterator).
            metrics: the step's metrics; gains the rounds' reward, KL and switch metrics and
                :meth:`~verl.algorithms.filter_groups.GroupFilter.metrics`.

        Returns:
            The kept rows of the first ``train_batch_size`` groups (``train_batch_size * rollout.n`` rows) with
            ``token_level_scores`` and ``token_level_rewards`` (and, with the in-reward KL, the old and reference
            log-probs), the trainer in training mode.

        Raises:
            DynamicSamplingError: the metric is missing or not numeric, or ``max_num_gen_batches`` rounds did
                not keep enough groups.
            ValueError: no ``more_batches`` while another round is needed.
        """
        from verl.algorithms.filter_groups import GroupFilter

        cfg = self.config
        fg = cfg.algorithm.filter_groups
        groups = GroupFilter(fg.metric, cfg.data.train_batch_size, fg.max_num_gen_batches)
        switch_every_round = self.rm_wg is not None or cfg.algorithm.use_kl_in_reward
        metrics.update(self.switcher.take_pending())
        while True:
            if groups.num_gen_batches > 0:
                if more_batches is None:
                    raise ValueError("filter_groups needs another generation round but train_step got no more batches")
                batch = next(more_batches)
            batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
            batch, n, baselines = self._generate(batch, metrics, round_index=groups.num_gen_batches, balance=False)
            if switch_every_round:
                metrics.update(self.switcher.to_training(self.stage))
            batch = self._score(batch, baselines, n, metrics)
            if cfg.algorithm.use_kl_in_reward:
                batch = self._log_probs(batch, metrics, values=False)
            with marked_timer("reward", self._timing):  # verl applies the in-reward KL in its reward stage
                batch = self._token_level_rewards(batch, metrics)
            groups.add(batch)
            if groups.ready:
                break
            groups.check_budget()
            if switch_every_round:
                metrics.update(self.switcher.to_generation(self.stage))
        if not switch_every_round:
            metrics.update(self.switcher.to_training(self.stage))
        metrics.update(groups.metrics())
        batch = groups.take()
        if cfg.trainer.balance_batch and self.world_size > 1:  # after the cut: balancing reorders the groups' rows
            from verl.trainer.balance import balance_batch

            metrics.update(balance_batch(batch, self.world_size))
        return batch

    def _data_epoch(self) -> int:
        """The epoch of the last batch the loader handed out (a filtered step may read several)."""
        loader = self.train_dataloader
        state = loader.state_dict()
        return (int(state["epoch"]) * len(loader) + int(state["batch_in_epoch"]) - 1) // len(loader)
