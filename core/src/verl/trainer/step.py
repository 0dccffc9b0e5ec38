"""One RL step as the named stages of DESIGN §5, with the hybrid engine's mode switches between them.

    gen -> [gen_max] -> sleep -> onload -> [rm] -> reward -> old_log_prob -> ref -> [values] -> adv
        -> [update_critic] -> update_actor -> [save_checkpoint] -> wake_up -> update_weights -> offload -> wake_up

With ``algorithm.filter_groups.enable`` (DAPO), ``gen`` through ``reward`` repeat over generation rounds until
enough prompt groups have reward spread (:mod:`verl.trainer.dynamic_sampling`). With
``async_training.staleness_threshold=1`` ``gen`` waits for the batch generated during the previous step, the
weights sync and the next batch's generation starts before the training stages (:mod:`verl.trainer.off_policy`).

Each stage runs in :meth:`StepStages.stage`, which fires the test-only fault injection point of that name
(:mod:`verl.trainer.faults`) and times it as ``timing_s/<stage>`` (verl's ``marked_timer``). ``values`` /
``update_critic`` run with a critic, ``rm`` with a reward model, ``gen_max`` for ReMax; the first
``trainer.critic_warmup`` steps skip ``update_actor``. The switches are :class:`~verl.trainer.switching.ModeSwitcher`'s.
Source: verl ``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.trainer import faults
from verl.trainer.agent_metrics import compute_agent_metrics
from verl.trainer.dynamic_sampling import ROUND_SEED_STRIDE, DynamicSampling
from verl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    marked_timer,
    reduce_metrics,
)
from verl.trainer.switching import step_memory_metrics

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


class StepStages(DynamicSampling):
    """The step of :class:`~verl.trainer.ppo_trainer.PPOTrainer` (a mixin: it reads the trainer's groups,
    config, reward functions and counters)."""

    config: Any
    global_steps: int
    stops: Any  # verl.trainer.stops.StopSignals
    _timing: dict[str, float]
    _step_in_flight: int

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Run one stage of the step in flight: its fault injection point, then its timer ``timing_s/<name>``."""
        faults.check(name, self._step_in_flight)
        pipe = getattr(self, "off_policy", None)
        if pipe is not None:  # the event log that shows generation overlapping the training stages
            pipe.record(f"{name}_start", self._step_in_flight)
        with marked_timer(name, self._timing):
            yield
        if pipe is not None:
            pipe.record(f"{name}_end", self._step_in_flight)

    def train_step(self, batch: Any, more_batches: Iterator[Any] | None = None) -> dict[str, Any]:
        """Run one RL step on a batch of prompts; returns the step's metrics.

        ``more_batches`` (the trainer's loader iterator) supplies the further generation rounds of
        ``algorithm.filter_groups`` (:meth:`_filtered_rollout`); without filtering it is not read.
        """
        metrics: dict[str, Any] = {}
        self._timing = timing = {}
        self._step_in_flight = self.global_steps + 1  # as it will be logged: the fault injection points' step
        algo = self.config.algorithm
        n = self.config.actor_rollout_ref.rollout.n
        with marked_timer("step", timing):
            if algo.filter_groups.enable:
                batch = self._filtered_rollout(batch, more_batches, metrics)
                # The in-reward KL needed the old and reference log-probs in every round, before filtering.
                batch = self._log_probs(batch, metrics, policy=not algo.use_kl_in_reward)
            elif self.off_policy is not None:  # async_training.staleness_threshold=1 (verl.trainer.off_policy)
                batch, n = self._off_policy_rollout(more_batches, metrics)
                batch = self._score(batch, None, n, metrics)
                batch = self._log_probs(batch, metrics)
            else:
                batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
                batch, n, baselines = self._generate(batch, metrics)
                metrics.update(self.switcher.take_pending())  # what the switch before the first step reported
                metrics.update(self.switcher.to_training(self.stage))
                batch = self._score(batch, baselines, n, metrics)
                batch = self._log_probs(batch, metrics)
            batch = self._advantages(batch, n, metrics)
            self._update(batch, metrics)
            self.global_steps += 1
            if self._should_save():
                # A Ctrl-C / SIGTERM from here on waits until the checkpoint is complete and this step's row is
                # logged (PPOTrainer.fit ends the hold): a stop never leaves a checkpoint without its row.
                self.stops.hold(f"checkpoint global_step_{self.global_steps} is saved and its step logged")
                with self.stage("save_checkpoint"):
                    self.save_checkpoint()
            if self.off_policy is None:  # off-policy: the weights go at the next step's start (or validation)
                metrics.update(self.switcher.to_generation(self.stage))
        if self.config.trainer.rollout_data_dir:
            self._dump_rollouts(batch)
        metrics.update(step_memory_metrics(metrics))
        metrics.update(compute_data_metrics(batch, use_critic=self.critic_wg is not None))
        metrics.update(compute_agent_metrics(batch))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, n_gpus=self.world_size))
        metrics.update(self.train_dataset.stats)  # data/skipped_rows, data/filtered_prompts, data/truncated_prompts
        metrics["training/global_step"] = self.global_steps
        # A filtered step reads one loader batch per round, so its epoch is the loader's, not the step count's.
        filtered = algo.filter_groups.enable
        metrics["training/epoch"] = self._data_epoch() if filtered else (self.global_steps - 1) // self.steps_per_epoch
        return metrics

    # ------------------------------------------------------------------ stages

    def _generate(
        self, batch: Any, metrics: dict[str, Any], *, round_index: int = 0, balance: bool = True
    ) -> tuple[Any, int, Any]:
        """``gen`` (and ReMax's ``gen_max``): the repeated prompts' responses joined to the batch (K13).

        ``round_index``: the generation round of a filtered step (seeds differ per round); ``balance=False``
        leaves the rows in group order (a filtered step balances its final batch).
        """
        cfg = self.config
        gen_batch, n = self._gen_batch(batch, validate=False, round_index=round_index)
        with self.stage("gen"):
            gen_out = self.rollout_wg.generate_sequences(gen_batch)
        baselines = None
        if cfg.algorithm.adv_estimator == "remax":
            with self.stage("gen_max"):
                baselines = self._greedy_baseline(batch)
        return self._finish_generation(batch, gen_out, n, metrics, balance=balance), n, baselines

    def _finish_generation(self, batch: Any, gen_out: Any, n: int, metrics: dict[str, Any], *, balance: bool) -> Any:
        """The rollout output joined to the repeated prompt rows, balanced over DP ranks (``balance``)."""
        cfg = self.config
        batch = self._join_rollout(batch, gen_out, n)
        if balance and cfg.trainer.balance_batch and self.world_size > 1:
            from verl.trainer.balance import balance_batch

            metrics.update(balance_batch(batch, self.world_size))
        # The temperature the rollout's log-probs used (K09): greedy decoding scores untempered logits.
        rollout_cfg = cfg.actor_rollout_ref.rollout
        batch.meta_info["temperature"] = rollout_cfg.temperature if rollout_cfg.do_sample else 1.0
        batch.meta_info.pop("timing", None)
        return batch

    def _off_policy_rollout(self, more_batches: Iterator[Any] | None, metrics: dict[str, Any]) -> tuple[Any, int]:
        """``gen`` of a one-step off-policy step: take the batch in flight, sync, start the next one.

        The schedule, staleness columns and resume behaviour are :mod:`verl.trainer.off_policy`'s. Returns
        ``(joined batch, n)``.
        """
        from verl.trainer.off_policy import staleness_columns
        from verl.workers.switching import reduce_rank_metrics

        if more_batches is None:
            raise ValueError("one-step off-policy reads its batches itself: pass the loader iterator")
        pipe = self.off_policy
        step = self._step_in_flight
        if pipe.pending is None:  # the first step of this process: nothing was generated ahead
            self._launch_generation(next(more_batches), step)
        with self.stage("gen"):
            pending, gen_out = pipe.take()
        if pipe.rollout_version != self.global_steps:
            with self.stage("update_weights"):
                metrics.update(reduce_rank_metrics(pipe.sync(self.global_steps)))
        if step < self.total_training_steps:
            pipe.loader_state = self.train_dataloader.state_dict()  # what this step's checkpoint stores
            self._launch_generation(next(more_batches), step + 1)
        batch = self._finish_generation(pending.batch, gen_out, pending.n, metrics, balance=True)
        metrics.update(staleness_columns(batch, pending.weight_version, self.global_steps))
        return batch, pending.n

    def _launch_generation(self, batch: Any, step: int) -> None:
        """Start generating ``batch`` for training step ``step`` (seeded as the synchronous loop seeds it)."""
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        with self.stage("gen_launch"):
            gen_batch, n = self._gen_batch(batch, validate=False, step=step - 1)
            self.off_policy.launch(batch, gen_batch, n, step)

    def _score(self, batch: Any, baselines: Any, n: int, metrics: dict[str, Any]) -> Any:
        """``rm`` (reward model) and ``reward`` (rule scorers, combined per ``reward_model.combine``)."""
        cfg = self.config
        if self.rm_wg is not None:
            with self.stage("rm"):
                batch = batch.union(self.rm_wg.compute_rm_score(batch))
        with self.stage("reward"):
            if self.rm_wg is None or cfg.reward_model.combine == "sum":
                self._reward(batch, self.reward_fn, metrics)
            if self.rm_wg is not None:
                from verl.trainer.roles import combine_scores

                rule = batch.batch["token_level_scores"] if "token_level_scores" in batch.batch.keys() else None
                batch.batch["token_level_scores"] = combine_scores(
                    rule, batch.batch["rm_scores"], cfg.reward_model.combine
                )
        if baselines is not None:
            batch.batch["reward_baselines"] = baselines.repeat_interleave(n)
        return batch

    def _log_probs(self, batch: Any, metrics: dict[str, Any], *, policy: bool = True, values: bool = True) -> Any:
        """``old_log_prob`` (or its reuse, see :meth:`old_log_prob_source`) and ``ref`` (``policy``), and the
        critic's ``values`` (``values``)."""
        if policy:
            batch = self._policy_log_probs(batch, metrics)
        if values and self.critic_wg is not None:
            with self.stage("values"):
                out = self.critic_wg.compute_values(batch)
                out.meta_info.clear()
                batch = batch.union(out)
        return batch

    def _policy_log_probs(self, batch: Any, metrics: dict[str, Any]) -> Any:
        from verl.algorithms import agg_loss

        actor = self.config.actor_rollout_ref.actor
        wg = self.actor_rollout_wg
        source = self.old_log_prob_source()
        batch.meta_info["old_log_prob_source"] = source
        if source != "recompute":  # no pass to time, but the stage's fault injection point still fires
            faults.check("old_log_prob", self._step_in_flight)
        if source == "rollout":
            batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        elif source == "recompute":
            with self.stage("old_log_prob"):
                old = wg.compute_log_prob(batch)
                entropys = old.batch.pop("entropys")
                metrics["actor/entropy"] = float(agg_loss(entropys, batch.batch["response_mask"], actor.loss_agg_mode))
                old.meta_info.clear()
                batch = batch.union(old)
        if self.use_reference_policy:
            with self.stage("ref"):
                ref = wg.compute_ref_log_prob(batch)
                ref.meta_info.clear()
                batch = batch.union(ref)
        return batch

    def _token_level_rewards(self, batch: Any, metrics: dict[str, Any]) -> Any:
        """``token_level_rewards``: the scores minus the in-reward KL (``algorithm.use_kl_in_reward``), else the
        scores themselves (verl's ``apply_kl_penalty`` / assignment in ``fit``)."""
        from verl.algorithms import apply_kl_penalty

        algo = self.config.algorithm
        if algo.use_kl_in_reward:
            batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return batch

    def _advantages(self, batch: Any, n: int, metrics: dict[str, Any]) -> Any:
        """``adv``: in-reward KL (optional), then the estimator on the driver."""
        from verl.algorithms import compute_advantage
        from verl.plugins import get_adv_estimator_fn

        algo = self.config.algorithm
        with self.stage("adv"):
            if "token_level_rewards" not in batch.batch.keys():  # a filtered step set them in every round
                batch = self._token_level_rewards(batch, metrics)
            batch = self._rollout_correction(batch, metrics)
            return compute_advantage(
                batch,
                adv_estimator=algo.adv_estimator,
                gamma=algo.gamma,
                lam=algo.lam,
                num_repeat=n,
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
                config=algo,
                estimator_fn=get_adv_estimator_fn(algo.adv_estimator),  # plugin-provided ones too
            )

    def _rollout_correction(self, batch: Any, metrics: dict[str, Any]) -> Any:
        """verl's decoupled rollout correction, in ``adv`` before the estimator (``algorithm.rollout_correction``).

        With the recomputed ``old_log_probs`` and the rollout's ``rollout_log_probs`` in the batch (and
        ``bypass_mode`` off): ``rollout_is_weights`` (``rollout_is``), the rejection-masked ``response_mask``
        (``rollout_rs``) and the ``rollout_corr/*`` metrics (always, as verl). Without a recomputed old
        policy (the on-policy fast path, which :meth:`old_log_prob_source` avoids when rollout_is or
        rollout_rs is set) there is nothing to compare and nothing is done.
        Source: verl/trainer/ppo/ray_trainer.py (fit: compute_rollout_correction_and_add_to_batch).
        """
        corr = self.config.algorithm.rollout_correction
        keys = batch.batch.keys()
        if corr.bypass_mode or "rollout_log_probs" not in keys or "old_log_probs" not in keys:
            return batch
        from verl.algorithms.rollout_correction import compute_rollout_correction_and_add_to_batch

        batch, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, corr)
        metrics.update(corr_metrics)
        return batch

    def _update(self, batch: Any, metrics: dict[str, Any]) -> None:
        """``update_critic`` then ``update_actor`` (skipped for the first ``trainer.critic_warmup`` steps)."""
        if self.critic_wg is not None:
            with self.stage("update_critic"):
                critic_out = self.critic_wg.update_critic(batch)
            metrics.update(reduce_metrics(critic_out.meta_info["metrics"]))
        # The first trainer.critic_warmup steps train only the critic (verl starts the actor at step
        # critic_warmup itself, one step earlier: here the count is exactly the critic-only steps).
        step = self._step_in_flight
        if step > self.config.trainer.critic_warmup:
            with self.stage("update_actor"):
                out = self.actor_rollout_wg.update_actor(batch)
            metrics.update(reduce_metrics(out.meta_info["metrics"]))
            metrics.update(self.nonfinite_guard.observe(out.meta_info["metrics"], step))

    # ------------------------------------------------------------------ helpers

    def _gen_batch(self, batch: Any, *, validate: bool, round_index: int = 0, step: int | None = None) -> Any:
        """The repeated prompt rows sent to the rollout, seeded from ``(rollout.seed, step)``; ``step`` defaults
        to ``global_steps`` (the steps done before the one this batch trains)."""
        rollout = self.config.actor_rollout_ref.rollout
        step = self.global_steps if step is None else step
        # Agent loops read the rows' other columns (raw_prompt, agent_name, tools_kwargs, extra_info, ...).
        columns = list(batch.non_tensor_batch.keys()) if rollout.mode == "async" else []
        gen = batch.select(batch_keys=list(PROMPT_KEYS), non_tensor_batch_keys=columns)
        n = rollout.val_kwargs.n if validate else rollout.n
        gen = gen.repeat(repeat_times=n, interleave=True)
        # Seeding each call from (seed, step) makes a resumed run sample exactly what an uninterrupted
        # run samples, without saving the sampler's RNG state; one seed per row (for engines that
        # honour `sample_seed`) makes the samples independent of how rows are split over DP ranks.
        seed = int(rollout.seed) * 1_000_003 + step * 2 + int(validate) + round_index * ROUND_SEED_STRIDE
        gen.batch["sample_seed"] = seed * 100_003 + torch.arange(len(gen), dtype=torch.int64)
        gen.meta_info.update(
            {
                "validate": validate,
                "do_sample": rollout.val_kwargs.do_sample if validate else rollout.do_sample,
                "global_steps": step,
                "seed": seed,
            }
        )
        return gen, n

    def _join_rollout(self, batch: Any, gen_out: Any, n: int) -> Any:
        """``batch.repeat(n, interleave=True)`` joined with the rollout output, row by row (K13).

        The rollout returns full prompt+response versions of the prompt keys, which replace the
        batch's. Its ``prompts`` must be the repeated prompts in the same row order: a backend that
        reordered rows would silently grade responses against another prompt's answer.

        In ``rollout.mode=async`` the agent loops render their own prompts (a tool agent adds the tool schemas),
        so the check does not apply; the manager returns row i's conversation at row i by construction.

        Raises:
            RuntimeError: the rollout output's rows do not follow the prompts' order.
        """
        batch = batch.repeat(repeat_times=n, interleave=True)
        sync = self.config.actor_rollout_ref.rollout.mode == "sync"
        returned = gen_out.batch["prompts"].cpu() if sync and "prompts" in gen_out.batch.keys() else None
        if returned is not None:
            # Both are left-padded; a backend may re-pad to another width, so compare the common
            # right-aligned columns where the sent prompt has real tokens.
            width = min(returned.shape[1], batch.batch["input_ids"].shape[1])
            sent = batch.batch["input_ids"][:, -width:].cpu()
            real = batch.batch["attention_mask"][:, -width:].cpu().bool()
            mismatch = ((returned[:, -width:] != sent) & real).any(-1)
        if returned is not None and bool(mismatch.any()):
            bad = int(mismatch.nonzero()[0])
            raise RuntimeError(
                f"the rollout engine returned rows in a different order than its prompts (first mismatch at row "
                f"{bad}); rollout engines must keep row i's response with prompt row i"
            )
        for key in PROMPT_KEYS:
            batch.batch.pop(key)
        return batch.union(gen_out)

    def _reward(self, batch: Any, reward_fn: Any, metrics: dict[str, Any], *, context: str | None = None) -> None:
        """Score ``batch`` in place (``token_level_scores``, ``reward_extra/*`` columns) and add the reward counts
        to ``metrics``. ``context`` names the call in an :class:`~verl.rewards.errors.AllRewardsFailedError`
        (default: the training step in flight)."""
        from verl.rewards.errors import AllRewardsFailedError

        try:
            result = reward_fn(batch, return_dict=True)
        except AllRewardsFailedError as exc:
            exc.context = context or f"training step {self._step_in_flight}"
            raise
        batch.batch["token_level_scores"] = result["reward_tensor"]
        for key, values in result["reward_extra_info"].items():
            if len(values) == len(batch):
                batch.non_tensor_batch[f"reward_extra/{key}"] = np.array(values, dtype=object)
        for key, value in result["metrics"].items():  # sample counts: summed over a filtered step's rounds
            metrics[key] = metrics.get(key, 0) + value

    def old_log_prob_source(self) -> str:
        """Where a step's old-policy log-probs come from: ``recompute``, ``on_policy`` or ``rollout``.

        * ``rollout`` (``algorithm.rollout_correction.bypass_mode``): the rollout's ``rollout_log_probs``,
          as verl's bypass mode; exact only when the rollout computes log-probs as the trainer does.
        * ``on_policy`` (``actor.reuse_on_policy_log_prob``, the default, when the update is one optimizer
          step over the whole batch: one epoch, ``ppo_mini_batch_size >= train_batch_size``, and no
          in-reward KL, which reads the old log-probs before the update): the update's own forward,
          detached, *is* the old policy's log-prob (same weights, same tokens), so the ratio is exactly 1;
          verl's ``dp_actor`` uses it the same way (``on_policy``) and TRL skips the pass as well.
          ``actor/entropy`` then comes from the update's forward (the same values). Not with
          ``rollout_correction.rollout_is`` / ``rollout_rs`` set: the trainer compares the old policy with
          the rollout's before the update (:meth:`_rollout_correction`), so the pass runs.
        * ``recompute``: a separate ``old_log_prob`` forward pass before the update (verl's default path).

        One-step off-policy (``async_training.staleness_threshold=1``, :mod:`verl.trainer.off_policy`) follows
        the same rule: the old policy PPO needs is the actor before this step's update, not the one-step-older
        policy that sampled the batch, and the update's own forward has exactly those weights, so ``on_policy``
        gives the same update as ``recompute`` (ratio 1 either way). verl's one-step trainer likewise takes its
        log-prob stage unchanged from the synchronous one (``SeparateRayPPOTrainer._fit_compute_log_prob``:
        recompute unless bypass mode; its recipe config turns ``bypass_mode`` on, the ``rollout`` source here,
        where the key keeps its default, off). What ``on_policy`` gives up is the stale-vs-current comparison on the
        driver (``rollout_corr/*``, logged only with a recomputed old policy); set
        ``actor.reuse_on_policy_log_prob=false`` to keep it at the cost of one forward per step.
        """
        cfg = self.config
        actor = cfg.actor_rollout_ref.actor
        corr = cfg.algorithm.rollout_correction
        if corr.bypass_mode:
            return "rollout"
        one_step = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= cfg.data.train_batch_size
        corrected = corr.rollout_is is not None or corr.rollout_rs is not None
        if actor.reuse_on_policy_log_prob and one_step and not cfg.algorithm.use_kl_in_reward and not corrected:
            return "on_policy"
        return "recompute"

    def _greedy_baseline(self, batch: Any) -> torch.Tensor:
        """ReMax's baseline: the score of one greedy response per prompt, ``(num_prompts,)`` float32.

        Source: verl/trainer/ppo/ray_trainer.py (``gen_max`` stage) and arXiv:2310.10505.
        """
        from verl.protocol import DataProto

        columns = list(batch.non_tensor_batch.keys()) if self.config.actor_rollout_ref.rollout.mode == "async" else []
        gen = batch.select(batch_keys=list(PROMPT_KEYS), non_tensor_batch_keys=columns)
        gen.meta_info.update({"do_sample": False, "global_steps": self.global_steps, "seed": 0})
        out = self.rollout_wg.generate_sequences(gen)
        scored = DataProto(batch=out.batch, non_tensor_batch=dict(batch.non_tensor_batch), meta_info={})
        rewards = self.reward_fn(scored, return_dict=True)["reward_tensor"]
        return rewards.sum(-1).float()

    def _should_save(self) -> bool:
        freq = self.config.trainer.save_freq
        last = self.global_steps >= self.total_training_steps
        return freq > 0 and (self.global_steps % freq == 0 or last)

    def _dump_rollouts(self, batch: Any) -> None:
        """verl's ``trainer.rollout_data_dir``: one ``{step}.jsonl`` with every sample of the step."""
        import json

        path = Path(self.config.trainer.rollout_data_dir)
        path.mkdir(parents=True, exist_ok=True)
        inputs = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        outputs = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        # A run scored by a reward model alone (reward_model.combine=replace) may have no reward_model column.
        columns = batch.non_tensor_batch
        rms = columns["reward_model"] if "reward_model" in columns else [None] * len(batch)
        truths = [rm.get("ground_truth") if isinstance(rm, dict) else None for rm in rms]
        uids = batch.non_tensor_batch["uid"]
        with open(path / f"{self.global_steps}.jsonl", "w") as fh:
            for i in range(len(batch)):
                row = {"input": inputs[i], "output": outputs[i], "gts": truths[i], "score": scores[i]}
                fh.write(json.dumps({**row, "uid": str(uids[i]), "step": self.global_steps}) + "\n")
