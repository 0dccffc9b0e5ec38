"""The RL training loop (GRPO, PPO with a critic, ...) as named stages.

One step, per DESIGN §5 and verl's ``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py``):

    gen -> [rm] -> reward -> old_log_prob -> ref -> [values] -> adv -> [update_critic] -> update_actor
        -> save_checkpoint -> update_weights

``values``/``update_critic`` run with a critic (``critic.enable``, on for ``algorithm.adv_estimator=gae``;
the first ``trainer.critic_warmup`` steps skip ``update_actor``), ``rm`` with ``reward_model.enable``
(see :mod:`verl.trainer.roles` for placement and how rule and model rewards combine).

each timed as ``timing_s/<stage>``. The trainer is a single-controller program: it holds
:class:`~verl.protocol.DataProto` batches and calls methods of a worker group; the
same code drives in-process workers and (later) Ray actors.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.trainer import faults
from verl.trainer.guards import NonFiniteStepGuard
from verl.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    marked_timer,
    reduce_metrics,
)

logger = logging.getLogger(__name__)

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


class PPOTrainer:
    """Runs ``verl train``: data, worker group, reward, advantage, logging, checkpoints.

    Args:
        config: resolved :class:`verl.config.RootConfig`.
        run_dir: where ``metrics.jsonl`` (and, from ``verl train``, ``config.yaml`` and ``final_hf/``) go;
            checkpoints go to ``trainer.default_local_dir``.

    Call :meth:`init` then :meth:`fit`.
    """

    def __init__(self, config: Any, run_dir: str | Path) -> None:
        from verl.platform import resolve_platform

        # An unavailable or unknown trainer.device fails here, before data or models are loaded.
        self.platform = resolve_platform(config.trainer.device)
        self.config = config
        self.run_dir = Path(run_dir)
        self.global_steps = 0
        self.total_training_steps = 0
        self.final_metrics: dict[str, float] = {}
        self.already_finished = False  # set by fit() when a resumed run had no step left
        self.validation_history: list[dict[str, Any]] = []
        self.nonfinite_guard = NonFiniteStepGuard(config.trainer.max_nonfinite_steps)

    # ------------------------------------------------------------------ set-up

    def init(self) -> None:
        """Build datasets, the worker group (engines), reward, KL control, checkpoints, loggers."""
        from verl.algorithms import get_kl_controller
        from verl.data.dataset import RLHFDataset
        from verl.data.sampler import create_dataloader
        from verl.models import load_tokenizer, resolve_model_path
        from verl.trainer.checkpoint import CheckpointManager
        from verl.trainer.tracking import Tracking, ValidationGenerationsLogger

        cfg = self.config
        faults.arm()  # test-only VERL_FAULT_INJECT; a typo fails here, before anything is loaded
        self.run_dir.mkdir(parents=True, exist_ok=True)
        model_path = resolve_model_path(cfg.actor_rollout_ref.model.path)
        self.tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path or model_path)
        self.train_dataset = RLHFDataset(
            list(cfg.data.train_files), self.tokenizer, cfg.data, max_samples=cfg.data.train_max_samples
        )
        self.val_dataset = (
            RLHFDataset(list(cfg.data.val_files), self.tokenizer, cfg.data, max_samples=cfg.data.val_max_samples)
            if cfg.data.val_files
            else None
        )
        self.train_dataloader = create_dataloader(self.train_dataset, cfg.data, train=True)
        self.val_dataloader = (
            create_dataloader(self.val_dataset, cfg.data, train=False) if self.val_dataset is not None else None
        )
        steps_per_epoch = len(self.train_dataloader)
        if steps_per_epoch == 0:
            raise ValueError(
                f"data.train_batch_size={cfg.data.train_batch_size} is larger than the training set "
                f"({len(self.train_dataset)} prompts after filtering): lower it or add data"
            )
        self.steps_per_epoch = steps_per_epoch
        self.total_training_steps = cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
        self.world_size = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        self.actor_rollout_wg, self.rollout_wg = self._build_worker_groups()
        self.actor_rollout_wg.init_model(self.total_training_steps)
        if self.rollout_wg is not self.actor_rollout_wg:
            self.rollout_wg.init_model(self.total_training_steps)
            self._init_standalone_sync()
        self.use_reference_policy = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self._build_critic_and_rm()
        # Stateless between calls, so training and validation share one manager (and its thread pool).
        self.reward_fn = self.val_reward_fn = self._build_reward_manager()
        self.kl_ctrl = get_kl_controller(cfg.algorithm.kl_ctrl) if cfg.algorithm.use_kl_in_reward else None
        # verl's layout: checkpoints under trainer.default_local_dir (checkpoints/<project>/<experiment>).
        self.checkpoints = CheckpointManager(
            cfg.trainer.default_local_dir, max_ckpt_to_keep=cfg.trainer.max_actor_ckpt_to_keep
        )
        self.tracking = Tracking(
            project_name=cfg.trainer.project_name,
            experiment_name=cfg.trainer.experiment_name,
            backends=list(cfg.trainer.logger),
            run_dir=self.run_dir,
            total_steps=self.total_training_steps,
        )
        self.val_generations = ValidationGenerationsLogger(self.tracking, cfg.trainer.log_val_generations)

    def _build_worker_groups(self) -> tuple[Any, Any]:
        """``(actor group, rollout group)``: the same hybrid group unless the rollout is standalone.

        ``controller=local``: one in-process worker. ``controller=ray``: a resource pool of
        ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` workers (the platform's Ray resource, one CPU
        bundle each on CPU), Ray started lazily or joined through ``ray_kwargs.ray_init.address`` /
        ``RAY_ADDRESS``. With ``rollout.nnodes > 0`` (standalone), the actor (+ref) pool and a rollout
        pool of ``rollout.nnodes`` x ``rollout.n_gpus_per_node`` workers, synced by broadcast.
        """
        from verl.controller import ClassWithInitArgs, LocalWorkerGroup
        from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

        cfg = self.config
        rollout = cfg.actor_rollout_ref.rollout
        if cfg.trainer.controller == "local":
            group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_rollout_ref"))
            return group, group
        from verl.controller.ray import RayResourcePool, RayWorkerGroup, init_ray

        init_ray(dict(cfg.ray_kwargs.ray_init))
        pool = RayResourcePool(
            [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes, platform=self.platform, name_prefix="verl_actor"
        )
        if rollout.nnodes == 0:
            worker = ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_rollout_ref")
            group = RayWorkerGroup(pool, worker, name_prefix="actor_rollout_ref", platform=self.platform)
            return group, group
        actor = RayWorkerGroup(
            pool, ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_ref"), name_prefix="actor_ref"
        )
        rollout_pool = RayResourcePool(
            [rollout.n_gpus_per_node] * rollout.nnodes, platform=self.platform, name_prefix="verl_rollout"
        )
        try:
            rollout_wg = RayWorkerGroup(
                rollout_pool, ClassWithInitArgs(ActorRolloutRefWorker, cfg, "rollout"), name_prefix="rollout"
            )
        except BaseException:
            actor.shutdown()
            raise
        return actor, rollout_wg

    def _build_critic_and_rm(self) -> None:
        """The critic group (``critic.enable``) and the reward-model group (``reward_model.enable``), or None."""
        from verl.trainer.roles import build_role_group

        cfg = self.config
        self.critic_wg = self.rm_wg = None
        if cfg.critic.enable:
            from verl.workers.critic import CriticWorker

            self.critic_wg = build_role_group(cfg, self.platform, CriticWorker, "critic")
            self.critic_wg.init_model(self.total_training_steps)
        if cfg.reward_model.enable:
            from verl.workers.reward_model import RewardModelWorker

            self.rm_wg = build_role_group(cfg, self.platform, RewardModelWorker, "rm")
            self.rm_wg.init_model()

    def _init_standalone_sync(self) -> None:
        # Both pools must join at once (the rendezvous blocks), hence the non-blocking calls.
        addr, port = self.actor_rollout_wg.weight_sync_address()
        world = self.rollout_wg.world_size
        for future in [g.init_weight_sync(addr, port, world) for g in (self.actor_rollout_wg, self.rollout_wg)]:
            future.get()

    def _sync_weights(self) -> None:
        """Actor weights -> rollout engine: hybrid hand-over, or the two pools' broadcast at once."""
        if self.rollout_wg is self.actor_rollout_wg:
            self.actor_rollout_wg.update_weights()
            return
        for future in [g.sync_weights() for g in (self.actor_rollout_wg, self.rollout_wg)]:
            future.get()

    def _build_reward_manager(self) -> Any:
        from verl.rewards import RewardManager
        from verl.rewards.manager import ScorerSpec

        cfg = self.config
        rm = cfg.reward_model
        custom = cfg.custom_reward_function
        compute_score = None
        if custom.path:  # loaded by path: in worker processes (isolation auto/process) or here (thread/none)
            compute_score = ScorerSpec(custom.path, custom.name, dict(custom.reward_kwargs))
        return RewardManager(
            self.tokenizer,
            compute_score=compute_score,
            reward_fn_key=cfg.data.reward_fn_key,
            reward_kwargs=dict(rm.reward_kwargs) if compute_score is None else None,
            timeout_s=rm.timeout_s,
            on_error=rm.on_error,
            num_workers=rm.num_workers,
            isolation=rm.isolation,
            memory_limit_mb=rm.memory_limit_mb,
        )

    # ------------------------------------------------------------------ stages

    def _gen_batch(self, batch: Any, *, validate: bool) -> Any:
        rollout = self.config.actor_rollout_ref.rollout
        gen = batch.select(batch_keys=list(PROMPT_KEYS))
        n = rollout.val_kwargs.n if validate else rollout.n
        gen = gen.repeat(repeat_times=n, interleave=True)
        # Seeding each call from (seed, step) makes a resumed run sample exactly what an uninterrupted
        # run samples, without saving the sampler's RNG state; one seed per row (for engines that
        # honour `sample_seed`) makes the samples independent of how rows are split over DP ranks.
        seed = int(rollout.seed) * 1_000_003 + self.global_steps * 2 + int(validate)
        gen.batch["sample_seed"] = seed * 100_003 + torch.arange(len(gen), dtype=torch.int64)
        gen.meta_info.update(
            {
                "validate": validate,
                "do_sample": rollout.val_kwargs.do_sample if validate else rollout.do_sample,
                "global_steps": self.global_steps,
                "seed": seed,
            }
        )
        return gen, n

    @staticmethod
    def _join_rollout(batch: Any, gen_out: Any, n: int) -> Any:
        """``batch.repeat(n, interleave=True)`` joined with the rollout output, row by row (K13).

        The rollout returns full prompt+response versions of the prompt keys, which replace the
        batch's. Its ``prompts`` must be the repeated prompts in the same row order: a backend that
        reordered rows would silently grade responses against another prompt's answer.

        Raises:
            RuntimeError: the rollout output's rows do not follow the prompts' order.
        """
        batch = batch.repeat(repeat_times=n, interleave=True)
        returned = gen_out.batch["prompts"].cpu() if "prompts" in gen_out.batch.keys() else None
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

    def _reward(self, batch: Any, reward_fn: Any, metrics: dict[str, Any]) -> None:
        result = reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        for key, values in result["reward_extra_info"].items():
            if len(values) == len(batch):
                batch.non_tensor_batch[f"reward_extra/{key}"] = np.array(values, dtype=object)
        metrics.update(result["metrics"])

    def train_step(self, batch: Any) -> dict[str, Any]:
        """Run one RL step on a batch of prompts; returns the step's metrics."""
        from verl.algorithms import agg_loss, apply_kl_penalty, compute_advantage

        cfg = self.config
        actor = cfg.actor_rollout_ref.actor
        wg = self.actor_rollout_wg
        metrics: dict[str, Any] = {}
        timing: dict[str, float] = {}
        step = self.global_steps + 1  # the step in flight, as it will be logged (fault injection points)
        with marked_timer("step", timing):
            batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
            gen_batch, n = self._gen_batch(batch, validate=False)
            faults.check("gen", step)
            with marked_timer("gen", timing):
                gen_out = self.rollout_wg.generate_sequences(gen_batch)
            if cfg.algorithm.adv_estimator == "remax":
                with marked_timer("gen_max", timing):
                    baselines = self._greedy_baseline(batch)
            batch = self._join_rollout(batch, gen_out, n)
            if cfg.trainer.balance_batch and self.world_size > 1:
                from verl.trainer.balance import balance_batch

                metrics.update(balance_batch(batch, self.world_size))
            # The temperature the rollout's log-probs used (K09): greedy decoding scores untempered logits.
            rollout_cfg = cfg.actor_rollout_ref.rollout
            batch.meta_info["temperature"] = rollout_cfg.temperature if rollout_cfg.do_sample else 1.0
            batch.meta_info.pop("timing", None)
            if self.rm_wg is not None:
                faults.check("rm", step)
                with marked_timer("rm", timing):
                    batch = batch.union(self.rm_wg.compute_rm_score(batch))
            faults.check("reward", step)
            with marked_timer("reward", timing):
                if self.rm_wg is None or cfg.reward_model.combine == "sum":
                    self._reward(batch, self.reward_fn, metrics)
                if self.rm_wg is not None:
                    from verl.trainer.roles import combine_scores

                    rule = batch.batch["token_level_scores"] if "token_level_scores" in batch.batch.keys() else None
                    scores = combine_scores(rule, batch.batch["rm_scores"], cfg.reward_model.combine)
                    batch.batch["token_level_scores"] = scores
            if cfg.algorithm.adv_estimator == "remax":
                batch.batch["reward_baselines"] = baselines.repeat_interleave(n)
            faults.check("old_log_prob", step)
            source = self.old_log_prob_source()
            batch.meta_info["old_log_prob_source"] = source
            if source == "rollout":
                batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
            elif source == "recompute":
                with marked_timer("old_log_prob", timing):
                    old = wg.compute_log_prob(batch)
                    entropys = old.batch.pop("entropys")
                    metrics["actor/entropy"] = float(
                        agg_loss(entropys, batch.batch["response_mask"], actor.loss_agg_mode)
                    )
                    old.meta_info.clear()
                    batch = batch.union(old)
            if self.use_reference_policy:
                faults.check("ref", step)
                with marked_timer("ref", timing):
                    ref = wg.compute_ref_log_prob(batch)
                    ref.meta_info.clear()
                    batch = batch.union(ref)
            if self.critic_wg is not None:
                faults.check("values", step)
                with marked_timer("values", timing):
                    values = self.critic_wg.compute_values(batch)
                    values.meta_info.clear()
                    batch = batch.union(values)
            faults.check("adv", step)
            with marked_timer("adv", timing):
                if cfg.algorithm.use_kl_in_reward:
                    batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, cfg.algorithm.kl_penalty)
                    metrics.update(kl_metrics)
                else:
                    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                batch = compute_advantage(
                    batch,
                    adv_estimator=cfg.algorithm.adv_estimator,
                    gamma=cfg.algorithm.gamma,
                    lam=cfg.algorithm.lam,
                    num_repeat=n,
                    norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
                    config=cfg.algorithm,
                )
            if self.critic_wg is not None:
                faults.check("update_critic", step)
                with marked_timer("update_critic", timing):
                    critic_out = self.critic_wg.update_critic(batch)
                metrics.update(reduce_metrics(critic_out.meta_info["metrics"]))
            # The first trainer.critic_warmup steps train only the critic (verl starts the actor at step
            # critic_warmup itself, one step earlier: here the count is exactly the critic-only steps).
            if step > cfg.trainer.critic_warmup:
                faults.check("update_actor", step)
                with marked_timer("update_actor", timing):
                    out = wg.update_actor(batch)
                metrics.update(reduce_metrics(out.meta_info["metrics"]))
                metrics.update(self.nonfinite_guard.observe(out.meta_info["metrics"], step))
            self.global_steps += 1
            if self._should_save():
                faults.check("save_checkpoint", step)
                with marked_timer("save_checkpoint", timing):
                    self.save_checkpoint()
            faults.check("update_weights", step)
            with marked_timer("update_weights", timing):
                self._sync_weights()
        if cfg.trainer.rollout_data_dir:
            self._dump_rollouts(batch)
        metrics.update(compute_data_metrics(batch, use_critic=self.critic_wg is not None))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing, n_gpus=self.world_size))
        metrics.update(self.train_dataset.stats)  # data/skipped_rows, data/filtered_prompts, data/truncated_prompts
        metrics["training/global_step"] = self.global_steps
        metrics["training/epoch"] = (self.global_steps - 1) // self.steps_per_epoch
        return metrics

    def old_log_prob_source(self) -> str:
        """Where a step's old-policy log-probs come from: ``recompute``, ``on_policy`` or ``rollout``.

        * ``rollout`` (``algorithm.rollout_correction.bypass_mode``): the rollout's ``rollout_log_probs``,
          as verl's bypass mode; exact only when the rollout computes log-probs as the trainer does.
        * ``on_policy`` (``actor.reuse_on_policy_log_prob``, the default, when the update is one optimizer
          step over the whole batch: one epoch, ``ppo_mini_batch_size >= train_batch_size``, and no
          in-reward KL, which reads the old log-probs before the update): the update's own forward,
          detached, *is* the old policy's log-prob (same weights, same tokens), so the ratio is exactly 1;
          verl's ``dp_actor`` uses it the same way (``on_policy``) and TRL skips the pass as well.
          ``actor/entropy`` then comes from the update's forward (the same values).
        * ``recompute``: a separate ``old_log_prob`` forward pass before the update (verl's default path).
        """
        cfg = self.config
        actor = cfg.actor_rollout_ref.actor
        if cfg.algorithm.rollout_correction.bypass_mode:
            return "rollout"
        one_step = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= cfg.data.train_batch_size
        if actor.reuse_on_policy_log_prob and one_step and not cfg.algorithm.use_kl_in_reward:
            return "on_policy"
        return "recompute"

    def _greedy_baseline(self, batch: Any) -> torch.Tensor:
        """ReMax's baseline: the score of one greedy response per prompt, ``(num_prompts,)`` float32.

        Source: verl/trainer/ppo/ray_trainer.py (``gen_max`` stage) and arXiv:2310.10505.
        """
        from verl.protocol import DataProto

        gen = batch.select(batch_keys=list(PROMPT_KEYS))
        gen.meta_info.update({"do_sample": False, "global_steps": self.global_steps, "seed": 0})
        out = self.rollout_wg.generate_sequences(gen)
        scored = DataProto(batch=out.batch, non_tensor_batch=dict(batch.non_tensor_batch), meta_info={})
        rewards = self.reward_fn(scored, return_dict=True)["reward_tensor"]
        return rewards.sum(-1).float()

    def _should_save(self) -> bool:
        freq = self.config.trainer.save_freq
        last = self.global_steps >= self.total_training_steps
        return freq > 0 and (self.global_steps % freq == 0 or last)

    # ------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        """Greedy (``val_kwargs``) generation on the validation set; verl's ``val-core`` metrics."""
        from verl.trainer.validation import compute_validation_metrics

        if self.val_dataloader is None:
            return {}
        logger.info("validation at step %d: %d prompts", self.global_steps, len(self.val_dataset))
        records: dict[str, list[Any]] = {"data_source": [], "score": [], "uid": [], "input": [], "output": []}
        extra: dict[str, float] = {}
        for batch in self.val_dataloader:
            uids = [str(uuid.uuid4()) for _ in range(len(batch))]
            gen_batch, n = self._gen_batch(batch, validate=True)
            out = self.rollout_wg.generate_sequences(gen_batch)
            batch = self._join_rollout(batch, out, n)
            metrics: dict[str, Any] = {}
            self._reward(batch, self.val_reward_fn, metrics)
            for key, value in metrics.items():
                extra[key] = extra.get(key, 0.0) + float(value)
            done = len(records["score"])
            scores = batch.batch["token_level_scores"].sum(-1).tolist()
            records["score"] += scores
            records["data_source"] += list(batch.non_tensor_batch["data_source"])
            records["uid"] += [u for u in uids for _ in range(n)]
            records["input"] += self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
            records["output"] += self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
            # Everything the scorer reported (acc, pred for maj@N, ...) feeds verl's validation metrics;
            # its own "score" is the token-level score already recorded. A key missing from some batches
            # is None there (the metrics skip a variable with any None).
            for key, values in batch.non_tensor_batch.items():
                if key.startswith("reward_extra/") and key != "reward_extra/score":
                    records.setdefault(key.removeprefix("reward_extra/"), [None] * done).extend(values)
            for values in records.values():
                values.extend([None] * (len(records["score"]) - len(values)))
        result = compute_validation_metrics(records)
        result.update({f"val-aux/{k}": v for k, v in extra.items()})
        self._dump_generations(records)
        self.val_generations.log(records["input"], records["output"], records["score"], step=self.global_steps)
        self.validation_history.append({"step": self.global_steps, **result})
        return result

    def _dump_rollouts(self, batch: Any) -> None:
        """verl's ``trainer.rollout_data_dir``: one ``{step}.jsonl`` with every sample of the step."""
        import json

        path = Path(self.config.trainer.rollout_data_dir)
        path.mkdir(parents=True, exist_ok=True)
        inputs = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        outputs = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        truths = [rm.get("ground_truth") for rm in batch.non_tensor_batch["reward_model"]]
        uids = batch.non_tensor_batch["uid"]
        with open(path / f"{self.global_steps}.jsonl", "w") as fh:
            for i in range(len(batch)):
                row = {"input": inputs[i], "output": outputs[i], "gts": truths[i], "score": scores[i]}
                fh.write(json.dumps({**row, "uid": str(uids[i]), "step": self.global_steps}) + "\n")

    def _dump_generations(self, records: dict[str, list[Any]]) -> None:
        import json

        folder = self.config.trainer.validation_data_dir
        if not folder:
            return
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        with open(path / f"{self.global_steps}.jsonl", "w") as fh:
            for i in range(len(records["score"])):
                row = {k: records[k][i] for k in ("input", "output", "score", "data_source")}
                fh.write(json.dumps({**row, "step": self.global_steps}) + "\n")

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Save actor, dataloader and trainer state as ``global_step_N`` (atomic, tracker last)."""
        from verl.trainer.checkpoint import capture_rng_state

        state = {
            "global_steps": self.global_steps,
            "rng": capture_rng_state(self.platform),
            "kl_coef": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
        }
        loader_state = self.train_dataloader.state_dict()
        parts = {
            "actor": lambda path: self.actor_rollout_wg.save_checkpoint(str(path)),
            "data.pt": lambda path: torch.save(loader_state, path),
            "trainer_state.pt": lambda path: torch.save(state, path),
        }
        if self.critic_wg is not None:  # verl's layout: global_step_N/critic beside .../actor
            parts["critic"] = lambda path: self.critic_wg.save_checkpoint(str(path))
        return self.checkpoints.save(self.global_steps, parts)

    def load_checkpoint(self) -> int:
        """Resume per ``trainer.resume_mode``; returns the restored step (0 when starting fresh)."""
        from verl.trainer.checkpoint import restore_rng_state

        trainer = self.config.trainer
        found = self.checkpoints.resolve_resume(trainer.resume_mode, trainer.resume_from_path)
        if found is None:
            return 0
        step, path = found
        self.actor_rollout_wg.load_checkpoint(str(Path(path) / "actor"))
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(str(Path(path) / "critic"))
        if self.rollout_wg is not self.actor_rollout_wg:
            self._sync_weights()  # the hybrid worker re-syncs in load_checkpoint; a standalone pool is remote
        self.train_dataloader.load_state_dict(torch.load(Path(path) / "data.pt", weights_only=False))
        state = torch.load(Path(path) / "trainer_state.pt", weights_only=False)
        restore_rng_state(state["rng"], self.platform)
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = state["kl_coef"]
        self.global_steps = step
        logger.info("resumed from %s (step %d)", path, step)
        return step

    # ------------------------------------------------------------------ loop

    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics.

        Resumes first (``trainer.resume_mode``); a run that already reached the last step
        reports so and returns without training. Otherwise ``metrics.jsonl`` is rewound to the
        starting step (:meth:`Tracking.rewind`): rows of steps after the checkpoint, which are about
        to run again, are dropped, so the log holds one row per step, as an uninterrupted run's.
        """
        cfg = self.config.trainer
        self.load_checkpoint()
        if self.global_steps >= self.total_training_steps:
            print(
                f"verl train: already finished ({self.global_steps}/{self.total_training_steps} steps in "
                f"{self.checkpoints.root}); nothing to do"
            )
            self.already_finished = True
            return {}
        self.tracking.rewind(self.global_steps)
        if cfg.val_before_train and self.global_steps == 0:
            val = self.validate()
            if val:
                self.tracking.log(val, step=0)
        metrics: dict[str, Any] = {}
        while self.global_steps < self.total_training_steps:
            for batch in self.train_dataloader:
                metrics = self.train_step(batch)
                last = self.global_steps >= self.total_training_steps
                if cfg.test_freq > 0 and (self.global_steps % cfg.test_freq == 0 or last):
                    with marked_timer("testing", timing := {}):
                        metrics.update(self.validate())
                    metrics["timing_s/testing"] = timing["testing"]
                self.tracking.log(metrics, step=self.global_steps)
                if self.nonfinite_guard.tripped:  # checkpoint (unless this step just saved one), then stop
                    self.final_metrics = metrics
                    saved = self._should_save()
                    raise self.nonfinite_guard.stop(
                        (lambda: self.checkpoints.step_dir(self.global_steps)) if saved else self.save_checkpoint
                    )
                if last:
                    break
        self.final_metrics = metrics
        return metrics

    def close(self) -> None:
        """Flush and close the loggers; stop Ray workers (the Ray runtime itself is left to its owner)."""
        try:
            if hasattr(self, "tracking"):
                self.tracking.close()
            reward_fn = getattr(self, "reward_fn", None)
            if reward_fn is not None and hasattr(reward_fn, "close"):
                reward_fn.close()  # stops the reward worker processes
        finally:
            roles = ("actor_rollout_wg", "rollout_wg", "critic_wg", "rm_wg")
            groups = {id(g): g for g in (getattr(self, name, None) for name in roles) if g is not None}
            for group in groups.values():
                shutdown = getattr(group, "shutdown", None)
                if shutdown is not None:
                    shutdown()
