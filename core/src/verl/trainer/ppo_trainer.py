"""The RL training loop (GRPO, PPO with a critic, ...): set-up, the loop, checkpoints and resume.

The trainer is a single-controller program: it holds :class:`~verl.protocol.DataProto` batches and calls
methods of worker groups (in-process or Ray actors, placed per ``rollout.placement``:
:mod:`verl.trainer.placement`). One step is :class:`~verl.trainer.step.StepStages` (the named stages of
DESIGN §5 and the hybrid engine's switches, :mod:`verl.trainer.switching`); validation is
:class:`~verl.trainer.validation_loop.ValidationLoop`. Critic and reward-model roles:
:mod:`verl.trainer.roles`. Follows verl's ``RayPPOTrainer`` (``verl/trainer/ppo/ray_trainer.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from verl.trainer import faults
from verl.trainer.dynamic_sampling import endless_batches, gen_batch_size
from verl.trainer.guards import NonFiniteStepGuard
from verl.trainer.placement import build_worker_groups, init_weight_sync_group, sync_weights
from verl.trainer.step import PROMPT_KEYS, StepStages
from verl.trainer.stops import StopSignals
from verl.trainer.switching import ModeSwitcher
from verl.trainer.validation_loop import ValidationLoop

logger = logging.getLogger(__name__)

__all__ = ["PROMPT_KEYS", "PPOTrainer", "check_model_fits_rollout"]


def check_model_fits_rollout(cfg: Any, model_path: Any) -> None:
    """Refuse a ``rollout.tensor_model_parallel_size`` the model cannot be split by, before any worker starts.

    Raises:
        ConfigError: the size does not divide the heads or MLP width (and, for the ``hf`` engine, the key/value
            heads and vocabulary, or the model has no tensor-parallel plan); one issue naming the key, the
            sizes and the valid choices.
    """
    tp = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
    if tp == 1:
        return
    from verl.config.errors import ConfigError, ConfigIssue
    from verl.config.placement import rollout_world_size
    from verl.engines.weight_sync.layout import TP_KEY, tensor_parallel_problems
    from verl.models.hf_config import load_hf_config

    model = cfg.actor_rollout_ref.model
    hf_config = load_hf_config(
        model_path, trust_remote_code=model.trust_remote_code, override_config=model.override_config
    )
    problems = tensor_parallel_problems(
        hf_config, tp, rollout_world_size(cfg), engine=cfg.actor_rollout_ref.rollout.name
    )
    if problems:
        raise ConfigError([ConfigIssue(TP_KEY, problem) for problem in problems])


class PPOTrainer(StepStages, ValidationLoop):
    """Runs ``verl train``: data, worker group, reward, advantage, logging, checkpoints.

    Args:
        config: resolved :class:`verl.config.RootConfig`.
        run_dir: where ``metrics.jsonl`` (and, from ``verl train``, ``config.yaml`` and ``final_hf/``) go;
            checkpoints go to ``trainer.default_local_dir``.
        stops: the SIGINT/SIGTERM handling the step holds while a checkpoint is saved (``verl train`` installs
            it); default: one that is not installed (Python's own handlers act).

    Call :meth:`init` then :meth:`fit`.
    """

    def __init__(self, config: Any, run_dir: str | Path, stops: StopSignals | None = None) -> None:
        from verl.plugins import choose_platform, get_plugin_manager
        from verl.plugins.selection import check_engines_run_on, describe_selection, selected_engines

        # An unavailable or unknown trainer.device fails here, before data or models are loaded; so does an
        # engine that does not run on the platform chosen automatically (config load checks a named one).
        choice = choose_platform(config.trainer.device)
        self.platform = choice.platform
        engines = selected_engines(config, get_plugin_manager())
        check_engines_run_on(engines, self.platform.name, self.platform.device_type)
        #: What was chosen and why (platform, engines with their plugins); `verl train` prints it at start.
        self.selection = describe_selection(choice, engines)
        self.config = config
        self.run_dir = Path(run_dir)
        self.global_steps = 0
        self.total_training_steps = 0
        self.final_metrics: dict[str, float] = {}
        self.already_finished = False  # set by fit() when a resumed run had no step left
        self.validation_history: list[dict[str, Any]] = []
        self.nonfinite_guard = NonFiniteStepGuard(config.trainer.max_nonfinite_steps)
        self._updates_at_checkpoint = (0, 0)  # the guard's (applied, skipped) counts at the last save / resume
        self.stops = stops if stops is not None else StopSignals()
        self.set_aside: list[tuple[Path, Path]] = []  # an earlier run's outputs renamed by init()
        self.off_policy: Any = None  # the one-step off-policy pipeline (async_training.staleness_threshold=1)

    # ------------------------------------------------------------------ set-up

    def init(self) -> None:
        """Build datasets, the worker group (engines), reward, KL control, checkpoints, loggers."""
        from verl.algorithms import get_kl_controller
        from verl.config.dump import to_dict
        from verl.data.dataset import RLHFDataset
        from verl.data.sampler import create_dataloader
        from verl.models import load_tokenizer, resolve_model_path
        from verl.trainer.checkpoint import CheckpointManager
        from verl.trainer.tracking import Tracking, ValidationGenerationsLogger

        cfg = self.config
        faults.arm()  # test-only VERL_FAULT_INJECT; a typo fails here, before anything is loaded
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._keep_earlier_run()
        model_path = resolve_model_path(cfg.actor_rollout_ref.model.path)
        # verl's driver loads the dataset's tokenizer with data.trust_remote_code; the model's own switch also
        # allows it here, since this tokenizer is the policy's.
        self.tokenizer = load_tokenizer(
            cfg.actor_rollout_ref.model.tokenizer_path or model_path,
            trust_remote_code=cfg.data.trust_remote_code or cfg.actor_rollout_ref.model.trust_remote_code,
        )
        train_columns, val_columns = self._reward_columns()
        self.train_dataset = RLHFDataset(
            list(cfg.data.train_files),
            self.tokenizer,
            cfg.data,
            max_samples=cfg.data.train_max_samples,
            reward_columns=train_columns,
        )
        self.val_dataset = (
            RLHFDataset(
                list(cfg.data.val_files),
                self.tokenizer,
                cfg.data,
                max_samples=cfg.data.val_max_samples,
                reward_columns=val_columns,
            )
            if cfg.data.val_files
            else None
        )
        self.train_dataloader = create_dataloader(self.train_dataset, cfg.data, train=True)
        self.val_dataloader = (
            create_dataloader(self.val_dataset, cfg.data, train=False) if self.val_dataset is not None else None
        )
        # Counted in loader batches of data.gen_batch_size prompts (verl); a filtered step may read several.
        steps_per_epoch = len(self.train_dataloader)
        if steps_per_epoch == 0:
            key = "data.gen_batch_size" if cfg.data.gen_batch_size else "data.train_batch_size"
            raise ValueError(
                f"{key}={gen_batch_size(cfg)} is larger than the training set "
                f"({len(self.train_dataset)} prompts after filtering): lower it or add data"
            )
        self.steps_per_epoch = steps_per_epoch
        self.total_training_steps = cfg.trainer.total_training_steps or steps_per_epoch * cfg.trainer.total_epochs
        self.world_size = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        check_model_fits_rollout(cfg, model_path)
        self.actor_rollout_wg, self.rollout_wg = build_worker_groups(cfg, self.platform)
        summaries = self.actor_rollout_wg.init_model(self.total_training_steps)
        # ONE_TO_ALL returns one summary per rank; a plugin's worker may not report an allocator.
        allocators = sorted({str(s["allocator"]) for s in summaries if isinstance(s, dict) and "allocator" in s})
        if allocators:
            logger.info("host allocator of the actor/rollout workers: %s", ", ".join(allocators))
        if self.rollout_wg is not self.actor_rollout_wg:
            self.rollout_wg.init_model(self.total_training_steps)
            init_weight_sync_group(self.actor_rollout_wg, self.rollout_wg)
        self.use_reference_policy = cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        self._build_critic_and_rm()
        self.switcher = ModeSwitcher(self.actor_rollout_wg, self.rollout_wg, self.critic_wg)
        if cfg.async_training.staleness_threshold > 0:
            from verl.trainer.off_policy import OneStepOffPolicy

            self.off_policy = OneStepOffPolicy(self.actor_rollout_wg, self.rollout_wg)
        # Stateless between calls, so training and validation share one manager (and its thread pool).
        self.reward_fn = self.val_reward_fn = self._build_reward_manager()
        self.kl_ctrl = get_kl_controller(cfg.algorithm.kl_ctrl) if cfg.algorithm.use_kl_in_reward else None
        # verl's layout: checkpoints under trainer.default_local_dir (checkpoints/<project>/<experiment>).
        self.checkpoints = CheckpointManager(
            cfg.trainer.default_local_dir,
            max_ckpt_to_keep=cfg.trainer.max_actor_ckpt_to_keep,
            part_limits={"critic": cfg.trainer.max_critic_ckpt_to_keep},
        )
        self.tracking = Tracking(
            project_name=cfg.trainer.project_name,
            experiment_name=cfg.trainer.experiment_name,
            backends=list(cfg.trainer.logger),
            run_dir=self.run_dir,
            config_dict=to_dict(cfg),  # wandb config, mlflow params, ... (verl passes the resolved config)
            total_steps=self.total_training_steps,
        )
        self.val_generations = ValidationGenerationsLogger(self.tracking, cfg.trainer.log_val_generations)

    def _keep_earlier_run(self) -> None:
        """Rename an earlier run's outputs in ``run_dir`` aside when this run starts from scratch.

        Without it, :meth:`fit` would rewind an earlier ``metrics.jsonl`` to zero rows (and the rest of
        :func:`verl.trainer.earlier_run.set_aside_earlier_run`'s list would be overwritten). ``verl train``
        already did this before writing the new ``config.yaml``; then nothing holds data any more and this
        call moves nothing, so the CLI's run is not moved twice. ``self.set_aside`` holds ``[(old, new)]``.

        Raises:
            CheckpointResumeError: a bad ``trainer.resume_mode`` / ``resume_from_path``.
        """
        from verl.trainer.earlier_run import set_aside_earlier_run

        self.set_aside = set_aside_earlier_run(self.run_dir, self.config)
        if self.set_aside:
            logger.warning(
                "%s holds an earlier run and this one starts from scratch (no checkpoint to resume under %s); "
                "its outputs were kept, renamed: %s",
                self.run_dir,
                self.config.trainer.default_local_dir,
                ", ".join(f"{old} -> {new}" for old, new in self.set_aside),
            )

    def _reward_columns(self) -> tuple[Any, Any]:
        """What the reward manager will read from the training rows and the validation rows
        (:class:`~verl.data.rows.RewardColumns`); ``None`` for training scored by a reward model alone
        (``reward_model.enable`` with ``combine=replace``: the rule reward does not run there)."""
        from verl.data.rows import RewardColumns
        from verl.rewards.default import check_data_source

        cfg = self.config
        rm = cfg.reward_model
        custom = cfg.custom_reward_function.path
        scorer = f"custom_reward_function {custom}" if custom else "the built-in scorers"
        common = {"source_key": cfg.data.reward_fn_key, "check_source": None if custom else check_data_source}
        train = None
        if not (rm.enable and rm.combine == "replace"):
            train = RewardColumns(
                **common,
                reader=f"the reward manager (scoring with {scorer})",
                alternative="score with a reward model alone (reward_model.enable=true, reward_model.combine=replace)",
            )
        # Validation always scores with the reward function and groups its metrics by data_source.
        val = RewardColumns(**common, also=("data_source",), reader=f"validation (scoring with {scorer})")
        return train, val

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

    def _build_reward_manager(self) -> Any:
        """verl's ``load_reward_manager``: ``reward_model.reward_manager`` (naive|dapo) with its share of
        ``reward_model.reward_kwargs``; the other keywords go to the built-in scorer, or to a custom one when it takes
        them by name or ``**kwargs`` (``custom_reward_function.reward_kwargs`` always, and win on a shared key)."""
        from verl.rewards import RewardManager
        from verl.rewards.manager import ScorerSpec
        from verl.rewards.reward_managers import split_reward_kwargs

        cfg = self.config
        rm = cfg.reward_model
        custom = cfg.custom_reward_function
        overlong, scorer_kwargs = split_reward_kwargs(rm.reward_manager, rm.reward_kwargs)
        compute_score = None
        if custom.path:  # loaded by path: in worker processes (isolation auto/process) or here (thread/none)
            # verl passes neither to a custom function; here they reach it when it takes them (else a warning).
            compute_score = ScorerSpec(custom.path, custom.name, dict(custom.reward_kwargs), dict(scorer_kwargs))
        return RewardManager(
            self.tokenizer,
            compute_score=compute_score,
            reward_fn_key=cfg.data.reward_fn_key,
            reward_kwargs=scorer_kwargs if compute_score is None else None,
            overlong_buffer=overlong,
            timeout_s=rm.timeout_s,
            on_error=rm.on_error,
            num_workers=rm.num_workers,
            isolation=rm.isolation,
            memory_limit_mb=rm.memory_limit_mb,
            stop_on_all_failed=rm.stop_on_all_failed,
        )

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Save actor (and critic), dataloader and trainer state as ``global_step_N`` (atomic, manifest, tracker last).

        ``data.json`` holds the sampler position, ``trainer_state.json`` ``{"global_steps", "kl_coef", "rng"}`` (the
        RNG state as :func:`~verl.trainer.rng_state.rng_state_to_json` data); nothing is pickled. The manifest
        records the checkpoint's health: whether every parameter the workers saved is finite, and how many actor
        updates were applied / skipped for a non-finite grad norm since the previous checkpoint (counted by
        :class:`~verl.trainer.guards.NonFiniteStepGuard`); rotation keeps the newest healthy checkpoint.
        """
        from verl.trainer.checkpoint import CheckpointHealth, capture_rng_state, write_json
        from verl.trainer.rng_state import rng_state_to_json

        state = {
            "global_steps": self.global_steps,
            "rng": rng_state_to_json(capture_rng_state(self.platform)),
            "kl_coef": None if self.kl_ctrl is None else float(self.kl_ctrl.value),
        }
        # One-step off-policy read the next step's batch already: store the state from before that read.
        pending_state = None if self.off_policy is None else self.off_policy.loader_state
        loader_state = self.train_dataloader.state_dict() if pending_state is None else pending_state
        reports: list[dict[str, Any]] = []  # per rank: {"rank", "nonfinite": [...]} from the workers' save

        def save_role(group: Any, path: Path) -> None:
            reports.extend(r for r in group.save_checkpoint(str(path)) or [] if isinstance(r, dict))

        parts = {
            "actor": lambda path: save_role(self.actor_rollout_wg, path),
            "data.json": lambda path: write_json(path, loader_state),
            "trainer_state.json": lambda path: write_json(path, state),
        }
        if self.critic_wg is not None:  # verl's layout: global_step_N/critic beside .../actor
            parts["critic"] = lambda path: save_role(self.critic_wg, path)
        guard = self.nonfinite_guard
        applied0, skipped0 = self._updates_at_checkpoint  # since the last save / resume

        def health() -> CheckpointHealth:
            nonfinite = sorted(f"rank{r.get('rank', '?')}:{n}" for r in reports for n in r.get("nonfinite", []))
            return CheckpointHealth(
                weights_finite=(not nonfinite) if reports else None,  # a worker that reports nothing: unknown
                updates_applied=guard.updates_applied - applied0,
                updates_skipped=guard.updates_skipped - skipped0,
                nonfinite=nonfinite,
            )

        saved = self.checkpoints.save(self.global_steps, parts, health=health)
        self._updates_at_checkpoint = (guard.updates_applied, guard.updates_skipped)
        return saved

    def load_checkpoint(self) -> int:
        """Resume per ``trainer.resume_mode``; returns the restored step (0 when starting fresh).

        The checkpoint is chosen and verified by :meth:`CheckpointManager.resolve_resume` (``auto`` falls back to
        the newest one that verifies). The trainer's JSON parts are read and checked before any worker loads.

        Raises:
            CheckpointUnusableError: no checkpoint verifies (or the ``resume_path`` one does not); names each file.
            CheckpointFileError: ``data.json`` / ``trainer_state.json`` hold fields of the wrong type or values
                that do not fit this run (names the file).
            WorkerError / NonFiniteCheckpointError: a worker refused its part (names the file or the parameters).
        """
        from verl.trainer.checkpoint import CheckpointFileError, read_json, restore_rng_state
        from verl.trainer.rng_state import rng_state_from_json

        trainer = self.config.trainer
        found = self.checkpoints.resolve_resume(trainer.resume_mode, trainer.resume_from_path)
        if found is None:
            if trainer.resume_mode == "auto":
                logger.info("no checkpoint under %s: training from scratch", self.checkpoints.root)
            return 0
        step, path = found
        data_file, state_file = Path(path) / "data.json", Path(path) / "trainer_state.json"
        loader_state = read_json(data_file)
        state = read_json(state_file)
        try:
            rng = rng_state_from_json(state.get("rng"))
            kl_coef = state.get("kl_coef")
            if kl_coef is not None and (isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float))):
                raise ValueError(f"field 'kl_coef' must be a number or null, got {kl_coef!r}")
        except ValueError as exc:
            raise CheckpointFileError(state_file, str(exc)) from exc
        self.actor_rollout_wg.load_checkpoint(str(Path(path) / "actor"))
        if self.critic_wg is not None:
            self.critic_wg.load_checkpoint(str(Path(path) / "critic"))
        if self.rollout_wg is not self.actor_rollout_wg:
            sync_weights(self.actor_rollout_wg, self.rollout_wg)  # the hybrid worker re-syncs in load_checkpoint
        try:
            self.train_dataloader.load_state_dict(loader_state)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointFileError(data_file, f"does not fit this run's data loader: {exc}") from exc
        try:
            restore_rng_state(rng, self.platform)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointFileError(state_file, f"holds an RNG state that cannot be restored: {exc}") from exc
        if self.kl_ctrl is not None and kl_coef is not None:
            self.kl_ctrl.value = float(kl_coef)
        self.global_steps = step
        guard = self.nonfinite_guard
        self._updates_at_checkpoint = (guard.updates_applied, guard.updates_skipped)
        logger.info("resumed from %s (step %d)", path, step)
        return step

    # ------------------------------------------------------------------ loop

    def _start_generation(self) -> None:
        """Before the first generation of :meth:`fit`: the hybrid engine's training engines leave the devices to
        the (awake) rollout; a standalone rollout pool already holds the loaded (or initial) weights.

        A fresh LoRA run from ``model.lora_adapter_path`` syncs first: the rollout loaded the base model folder,
        while the actor starts from base + that adapter (a rollout sharing the actor's module needs nothing)."""
        model = self.config.actor_rollout_ref.model
        if self.global_steps == 0 and model.lora_rank > 0 and model.lora_adapter_path:
            sync_weights(self.actor_rollout_wg, self.rollout_wg)
        if self.off_policy is None:
            self.switcher.enter_generation()
        else:
            self.off_policy.rollout_version = self.global_steps

    def _validate_only(self) -> dict[str, float]:
        """``trainer.val_only``: validate the loaded policy (the initial model, or the resumed checkpoint's) once,
        log it at the current step, and return its metrics; nothing trains, saves or rewinds the log."""
        self._start_generation()
        val = self.validate()
        if val:
            self.tracking.log(val, step=self.global_steps)
        return val

    def fit(self) -> dict[str, float]:
        """Train until ``total_training_steps``; returns the last step's metrics.

        Resumes first (``trainer.resume_mode``). ``metrics.jsonl`` is rewound to the starting step
        (:meth:`Tracking.rewind`): rows of steps after the checkpoint, which are about to run again, are dropped,
        so the log holds one row per step, as an uninterrupted run's. Each step's row is logged (fsynced) before
        its validation runs; the validation metrics are then merged into it (:meth:`Tracking.update`). A resumed
        step whose row lacks the validation that was due runs it first (:meth:`_complete_resumed_step`). A run
        resumed at its last step is finished only when that row is complete; otherwise the missing validation
        runs and :attr:`already_finished` is set so the caller exports ``final_hf/`` if missing.

        Raises:
            NonFiniteStepsError: the non-finite step guard tripped (:mod:`verl.trainer.guards`).
            StopRequested: SIGINT/SIGTERM, when :attr:`stops` is installed (after the checkpoint in progress and
                its step's row, :mod:`verl.trainer.stops`).
        """
        cfg = self.config.trainer
        self.load_checkpoint()
        if cfg.val_only:
            return self._validate_only()
        self.tracking.rewind(self.global_steps)
        rows = self.tracking.rows()
        if rows is not None and self.global_steps > 0:
            self.nonfinite_guard.resume(rows, self.global_steps)
        if self.global_steps >= self.total_training_steps:
            self.already_finished = True
            if self._complete_resumed_step(rows, last=True):
                return self.final_metrics
            print(
                f"verl train: already finished ({self.global_steps}/{self.total_training_steps} steps in "
                f"{self.checkpoints.root}); nothing to do"
            )
            return {}
        self._start_generation()
        self._complete_resumed_step(rows, last=False)
        if cfg.val_before_train and self.global_steps == 0:
            val = self.validate()
            if val:
                self.tracking.log(val, step=0)
        metrics: dict[str, Any] = {}
        # One iterator over the epochs: a step with algorithm.filter_groups takes its further rounds from it.
        batches = endless_batches(self.train_dataloader)
        try:
            while self.global_steps < self.total_training_steps:
                # A stop signal during the step's checkpoint save waits for the save and this row (stops.py).
                with self.stops.step():
                    # One-step off-policy reads its batches from the iterator itself, one step ahead.
                    metrics = self.train_step(None if self.off_policy else next(batches), batches)
                    self.tracking.log(metrics, step=self.global_steps)
                last = self.global_steps >= self.total_training_steps
                guard = self.nonfinite_guard
                if guard.tripped or (last and guard.nothing_applied):
                    self._stop_nonfinite(metrics)
                if self._validation_due(self.global_steps):
                    metrics.update(self._validate_step())
        finally:
            batches.close()  # stops the loader's row-reading worker processes (data.dataloader_num_workers)
        self.final_metrics = metrics
        return metrics

    def _stop_nonfinite(self, metrics: dict[str, Any]) -> None:
        """Checkpoint (unless this step just saved one), then raise the guard's :class:`NonFiniteStepsError`."""
        self.final_metrics = metrics
        saved = self._should_save()
        self.stops.hold("the checkpoint before stopping is saved")
        try:
            error = self.nonfinite_guard.stop(
                (lambda: self.checkpoints.step_dir(self.global_steps)) if saved else self.save_checkpoint
            )
        finally:
            self.stops.discard()  # the run stops right after either way
        raise error

    def close(self, exit_code: int = 0) -> None:
        """Flush and close the loggers; stop Ray workers (the Ray runtime itself is left to its owner).

        ``exit_code`` != 0 marks the loggers' run failed (verl's ``Tracking.finish(exit_code)``)."""
        try:
            if hasattr(self, "tracking"):
                self.tracking.finish(exit_code)
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
