"""Supervised fine-tuning on chat data (verl ``verl/trainer/sft_trainer.py``): ``verl sft CONFIG k=v`` or
``python -m verl.trainer.sft_trainer CONFIG k=v``.

One optimizer step per ``data.train_batch_size`` rows through the RL actor's training engine, any installed one
(``engine.strategy``: ``reference`` in one process; ``fsdp`` or ``megatron`` over torchrun's ranks, each data-parallel
rank training an equal, contiguous share of the step's rows; :mod:`verl.trainer.sft_engine`,
:mod:`verl.trainer.sft_ranks`), with :func:`verl.workers.losses.make_sft_loss` (micro-batches / token budget /
packing as for the actor; LoRA with ``model.lora_rank``). Metrics use verl's names: ``train/loss``,
``train/grad_norm``, ``train/lr``, ``train/global_tokens``, ``train/total_tokens(B)``, ``val/loss`` (the mean
of the validation batches' token-mean NLL, verl's), plus ``timing_s/step`` and ``timing_s/testing`` (seconds). Checkpoints are ``<default_local_dir>/global_step_N/`` (the
engine state in ``actor/``, the sampler position, counters and RNG state in ``data.json``), written every ``save_freq``
steps and at the last step; ``resume_mode=auto`` continues from the newest one exactly (same batches, same
weights). A sharded engine writes its own checkpoint format into ``actor/`` (FSDP: DCP, every rank its shard). At the
end the weights and tokenizer are written to ``<default_local_dir>/final_hf/``, a HF folder that loads as
``actor_rollout_ref.model.path`` of an RL run (with LoRA: the merged model, the adapter in ``final_hf/lora_adapter/``).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from verl.config.schema.sft import SFTConfig

logger = logging.getLogger(__name__)

FINAL_HF_DIR = "final_hf"


class SFTTrainer:
    """Builds the datasets, the engine and the checkpoint manager of one SFT run; :meth:`fit` trains.

    Args:
        config: a validated :class:`SFTConfig` (:func:`verl.config.sft_loader.load_sft_config`).
        tokenizer: a HF tokenizer to use instead of loading ``model.tokenizer_path`` / ``model.path``.

    Raises:
        SFTRowError: a bad training/validation row (names file and row).
        ValueError: a model that cannot be loaded.
        ConfigError: the engine or its options refused, batch sizes that the data-parallel ranks do not divide,
            fewer training rows than ``data.train_batch_size``, or a ``model.path`` that does not resolve.
    """

    def __init__(self, config: SFTConfig, *, tokenizer: Any = None, stops: Any = None) -> None:
        from verl.config.errors import ConfigError
        from verl.data.sampler import StatefulSampler
        from verl.data.sft_dataset import SFTDataset
        from verl.models.resolve import resolve_model_path
        from verl.plugins import resolve_platform
        from verl.trainer.checkpoint import CheckpointManager
        from verl.trainer.sft_engine import build_sft_engine, check_world, data_parallel, resolved_strategy
        from verl.trainer.sft_ranks import join_process_group, torchrun_world
        from verl.workers.losses import make_sft_loss

        self.config = cfg = config
        d, m, t = cfg.data, cfg.model, cfg.trainer
        self.world = torchrun_world(t.nnodes, t.n_gpus_per_node)
        platform = resolve_platform(t.device)
        join_process_group(self.world, platform)
        platform.configure_allocator()
        self.device = platform.torch_device()
        from verl.trainer.sft_ranks import barrier

        if not self.world.is_main:
            barrier(self.world)  # rank 0 converts a GGUF default model once; the others then find the folder
        from verl.models.resolve import ModelResolutionError
        from verl.trainer.sft_engine import sft_key

        try:
            model_path = resolve_model_path(m.path)
        except ModelResolutionError as exc:
            raise ConfigError(sft_key(str(exc)), key="model.path") from exc
        finally:
            if self.world.is_main:
                barrier(self.world)
        if tokenizer is None:
            from verl.models.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(
                m.tokenizer_path or model_path, require_chat_template=True, trust_remote_code=m.trust_remote_code
            )
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.train_dataset = SFTDataset(d.train_files, tokenizer, d, max_samples=d.train_max_samples)
        self.val_dataset = SFTDataset(d.val_files, tokenizer, d, max_samples=d.val_max_samples) if d.val_files else None
        if len(self.train_dataset) < d.train_batch_size:
            raise ConfigError(
                f"data.train_batch_size={d.train_batch_size} but data.train_files hold {len(self.train_dataset)} "
                "rows: no full batch; lower the batch size or add rows",
                key="data.train_batch_size",
            )
        self.sampler = StatefulSampler(
            len(self.train_dataset), d.train_batch_size, shuffle=d.shuffle, seed=t.seed, drop_last=True
        )
        self.steps_per_epoch = len(self.sampler)
        self.total_training_steps = t.total_training_steps or self.steps_per_epoch * t.total_epochs
        torch.manual_seed(t.seed)  # the same on every rank: LoRA's A starts equal everywhere
        self.engine = build_sft_engine(
            cfg,
            model_path=model_path,
            total_training_steps=self.total_training_steps,
            device=self.device,
            world_size=self.world.world_size,
        )
        self.model_path = model_path
        self.strategy = resolved_strategy(cfg)
        self.dp_rank, self.dp_size, self.is_collect = data_parallel(self.engine, self.world.rank, self.world.world_size)
        check_world(cfg, self.dp_size)
        self.engine.metric_prefix = "train"  # verl's SFT names: train/grad_norm, train/lr
        self.loss_fn = make_sft_loss()
        self.run_dir = Path(t.default_local_dir).expanduser()
        # One writer of the run folder's checkpoints (and their scratch clean-up): rank 0.
        self.checkpoints = CheckpointManager(self.run_dir, t.max_ckpt_to_keep or None) if self.world.is_main else None
        from verl.trainer.stops import StopSignals

        # SIGINT/SIGTERM wait while a checkpoint is saved (verl sft installs it; not installed, it changes nothing).
        self.stops = stops if stops is not None else StopSignals()
        self._updates = [0, 0]  # optimizer updates applied / skipped (non-finite grad norm) since the last save
        self.global_step = 0
        self.total_tokens = 0

    # ------------------------------------------------------------------ batches

    def collate(self, items: Sequence[dict]) -> Any:
        """Rows -> the engine's batch (:func:`verl.data.sft_dataset.collate_sft`), padded per ``data.pad_mode``."""
        from verl.data.sft_dataset import collate_sft

        pad_to = self.config.data.max_length if self.config.data.pad_mode == "right" else None
        return collate_sft(items, self.pad_id, pad_to=pad_to)

    def _share(self, rows: Sequence[int]) -> Sequence[int]:
        """This data-parallel rank's contiguous share of a step's ``rows`` (equal shares: :func:`check_world`)."""
        size = len(rows) // self.dp_size
        return rows[self.dp_rank * size : (self.dp_rank + 1) * size]

    def _next_batch(self) -> tuple[Any, int]:
        """``(this rank's batch, real tokens of the whole step)`` of the next step's rows."""
        rows = self.sampler.remaining_batches()[0]
        self.sampler.advance(1)
        tokens = sum(len(self.train_dataset[i]["input_ids"]) for i in rows)
        return self.collate([self.train_dataset[i] for i in self._share(rows)]), tokens

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> float:
        """``val/loss``: mean over validation batches (``train_batch_size`` rows, the last one may be short) of
        each batch's token-mean NLL on its loss-mask tokens (verl averages the per-batch losses).

        With several data-parallel ranks each batch is split as the training rows are; a batch too short for an
        equal split is topped up with copies of its first row whose loss mask is empty (every rank of a sharded
        engine has to run the forward), and the NLL sums and token counts are added over the ranks.
        """
        assert self.val_dataset is not None
        size = self.config.data.train_batch_size
        sums: list[float] = []
        for start in range(0, len(self.val_dataset), size):
            items = [self.val_dataset[i] for i in range(start, min(start + size, len(self.val_dataset)))]
            blank = {**items[0], "loss_mask": [0] * len(items[0]["loss_mask"])}
            items += [blank] * (-len(items) % self.dp_size)
            batch = self.collate(list(self._share(items)))
            log_probs = self.engine.compute_log_prob(batch).batch["old_log_probs"]
            mask = batch.batch["response_mask"].to(log_probs.dtype)
            weight = 1.0 if self.is_collect else 0.0  # a model-parallel replica's ranks hold the same numbers
            sums += [weight * float(-(log_probs * mask).sum()), weight * float(mask.sum())]
        from verl.trainer.sft_ranks import all_reduce_sum

        totals = all_reduce_sum(sums, self.device, self.world)
        losses = [nll / tokens for nll, tokens in zip(totals[::2], totals[1::2], strict=True) if tokens > 0]
        return sum(losses) / len(losses) if losses else math.nan

    # ------------------------------------------------------------------ checkpoints

    def _sharded(self) -> bool:
        """Whether the engine writes its own checkpoint format, every rank its shard (FSDP's DCP, Megatron)."""
        return hasattr(self.engine, "save_checkpoint") and hasattr(self.engine, "load_checkpoint")

    def _write_actor(self, path: Path) -> None:
        """This rank's part of ``global_step_N/actor/`` (collective for a sharded engine): the engine state (the
        reference engine's :mod:`~verl.engines.reference.checkpoint_files`, as the RL worker writes them), the LoRA
        adapter, and on rank 0 what ``verl export`` reads (``checkpoint.json``, ``huggingface/``)."""
        from verl.engines.reference.checkpoint_files import save_engine_state
        from verl.engines.reference.export import write_export_info

        path.mkdir(parents=True, exist_ok=True)
        if self._sharded():
            self.engine.save_checkpoint(path)
        else:
            save_engine_state(path, self.engine.state_dict(), 1, 0)
        lora = bool(getattr(self.engine, "lora", False))
        if lora:
            from verl.engines.lora import ADAPTER_DIR

            self.engine.save_adapter(path / ADAPTER_DIR)
        if self.world.is_main:
            m = self.config.model
            write_export_info(
                path,
                model_path=self.model_path,
                tokenizer=self.tokenizer,
                strategy=self.strategy,
                world_size=self.world.world_size,
                lora=lora,
                trust_remote_code=m.trust_remote_code,
                override_config=m.override_config,
            )

    def save_checkpoint(self) -> Path | None:
        """Write ``global_step_{N}/`` (``actor/``: :meth:`_write_actor`; ``data.json``: the loop state, RNG state,
        the engine and the number of processes); returns it on rank 0.

        Rank 0 writes through the checkpoint manager (temp folder, tracker last) and sends the temp folder's path
        to the other ranks, which write their shards into ``actor/`` there.
        """
        from verl.trainer.rng_state import capture_rng_state, rng_state_to_json
        from verl.trainer.sft_ranks import barrier, broadcast_from_main

        loop = {
            "global_step": self.global_step,
            "total_tokens": self.total_tokens,
            "sampler": self.sampler.state_dict(),
            "rng": rng_state_to_json(capture_rng_state()),
            "engine": self.strategy,
            "world_size": self.world.world_size,
        }
        health = self._health()  # collective: every rank checks its weights
        if not self.world.is_main:
            target = broadcast_from_main(None, self.world)
            if target is not None:
                self._write_actor(Path(target))
            barrier(self.world)
            return None
        sent = False

        def write_actor(path: Path) -> None:
            nonlocal sent
            broadcast_from_main(str(path), self.world)
            sent = True
            self._write_actor(path)

        try:
            saved = self.checkpoints.save(
                self.global_step, {"actor": write_actor, "data.json": loop}, health=lambda: health
            )
        finally:
            if not sent:  # failed before the shards: release the other ranks
                broadcast_from_main(None, self.world)
            barrier(self.world)
        return saved

    def _health(self) -> Any:
        """The checkpoint's :class:`~verl.trainer.checkpoint.CheckpointHealth`: whether every rank's weights are
        finite (summed over the ranks; names from rank 0) and the updates applied / skipped since the last save, whose
        counts it then resets. Collective: every rank calls it.

        Raises:
            RuntimeError: the all-reduce over the ranks failed (torch.distributed's error).
        """
        from verl.engines.safe_files import engine_nonfinite_state
        from verl.trainer.checkpoint import CheckpointHealth
        from verl.trainer.sft_ranks import all_reduce_sum

        names = engine_nonfinite_state(self.engine)[0]
        total = int(all_reduce_sum([float(len(names))], self.device, self.world)[0])
        applied, skipped = self._updates
        self._updates = [0, 0]
        return CheckpointHealth(
            weights_finite=total == 0, updates_applied=applied, updates_skipped=skipped, nonfinite=sorted(names)
        )

    def resume(self) -> int:
        """Restore the checkpoint ``trainer.resume_mode`` picks; returns its step (0 = from scratch).

        Rank 0 picks it; every rank loads it (its shard of a sharded engine; rank 0's RNG state everywhere).

        Raises:
            CheckpointResumeError: bad resume settings, a missing checkpoint folder, a checkpoint that does not
                verify (:class:`~verl.trainer.checkpoint.CheckpointUnusableError`: damaged, or the old pickle
                format), or one written by another engine or number of processes (named, with the ways out).
            CheckpointFileError: ``data.json`` fields of the wrong type (names the file).
            NonFiniteCheckpointError: the loaded weights or optimizer state hold NaN/inf (names them).
        """
        from verl.engines.reference.checkpoint_files import load_engine_state
        from verl.engines.safe_files import NonFiniteCheckpointError, engine_nonfinite_state
        from verl.trainer.checkpoint import CheckpointFileError, CheckpointResumeError, read_json
        from verl.trainer.rng_state import restore_rng_state, rng_state_from_json
        from verl.trainer.sft_ranks import broadcast_from_main

        t = self.config.trainer
        found = None
        if self.world.is_main:
            try:
                found = self.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path)
            except Exception as exc:
                broadcast_from_main(exc, self.world)
                raise
        found = broadcast_from_main(found, self.world)
        if isinstance(found, Exception):
            raise found
        if found is None:
            return 0
        step, path = found
        loop_file = Path(path) / "data.json"
        loop = read_json(loop_file)
        saved = (loop.get("engine"), loop.get("world_size"))
        if saved[0] is not None and saved != (self.strategy, self.world.world_size):
            raise CheckpointResumeError(
                f"{path} was written by engine.strategy={saved[0]} over {saved[1]} process(es), this run is "
                f"engine.strategy={self.strategy} over {self.world.world_size}: resume with the same engine and "
                "number of processes (trainer.n_gpus_per_node, or torchrun's --nproc_per_node), start from scratch "
                f"with trainer.resume_mode=disable, or take its weights with `verl export {path} <out folder>`"
            )
        try:
            rng = rng_state_from_json(loop.get("rng"))
            counters = {k: loop.get(k) for k in ("global_step", "total_tokens")}
            for key, value in counters.items():
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"field {key!r} must be an int >= 0, got {value!r}")
            self.sampler.load_state_dict(loop.get("sampler") or {})
            restore_rng_state(rng)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointFileError(loop_file, str(exc)) from exc
        actor = Path(path) / "actor"
        if self._sharded():
            self.engine.load_checkpoint(actor)
        else:
            self.engine.load_state_dict(load_engine_state(actor, 1, 0))
        params, optim = engine_nonfinite_state(self.engine)
        if params or optim:
            raise NonFiniteCheckpointError(actor, params or optim, "parameters" if params else "optimizer state")
        self.global_step = counters["global_step"]
        self.total_tokens = counters["total_tokens"]
        if self.world.is_main:
            logger.info("resumed SFT from %s (step %d)", path, step)
        return step

    # ------------------------------------------------------------------ loop

    def fit(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
        """Train to ``total_training_steps`` (resuming first); returns the last step's metrics.

        Args:
            on_step: called as ``on_step(step, metrics)`` after each step's checkpoint (tests stop a run there).
        """
        import contextlib

        from verl.config.dump import to_dict, to_yaml
        from verl.trainer.earlier_run import set_aside_outputs
        from verl.trainer.sft_ranks import barrier
        from verl.trainer.tracking import Tracking

        t = self.config.trainer
        main = self.world.is_main
        if self.resume() == 0 and main:
            # A fresh run would rewind metrics.jsonl and replace final_hf/: keep the earlier run's files.
            for old, moved in set_aside_outputs(self.run_dir):
                logger.warning("earlier run's %s kept as %s", old, moved.name)
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(self.config), encoding="utf-8")
        barrier(self.world)  # nobody writes into the folder before the earlier run's files are aside
        metrics: dict[str, float] = {}
        tracker: Any = (
            Tracking(
                t.project_name,
                t.experiment_name,
                backends=t.logger,
                run_dir=self.run_dir,
                config_dict=to_dict(self.config),
                total_steps=self.total_training_steps,
            )
            if main
            else contextlib.nullcontext()
        )
        with tracker as tracking:
            if tracking is not None:
                tracking.rewind(self.global_step)
            while self.global_step < self.total_training_steps:
                started = time.perf_counter()
                batch, tokens = self._next_batch()
                # The engines return global values: a sharded engine sums the loss over its ranks.
                raw = self.engine.train_batch(batch, self.loss_fn)
                norms = [float(v) for v in raw.get("train/grad_norm", [])]
                self._updates[0] += sum(1 for v in norms if math.isfinite(v))
                self._updates[1] += sum(1 for v in norms if not math.isfinite(v))
                step_s = time.perf_counter() - started
                self.global_step += 1
                metrics = {k: sum(v) / len(v) for k, v in raw.items() if v}
                self.total_tokens += tokens
                metrics["train/global_tokens"] = float(tokens)
                metrics["train/total_tokens(B)"] = self.total_tokens / 1e9
                metrics["train/epoch"] = float((self.global_step - 1) // self.steps_per_epoch)
                metrics["timing_s/step"] = step_s
                last = self.global_step >= self.total_training_steps
                if self.val_dataset is not None and (last or (t.test_freq > 0 and self.global_step % t.test_freq == 0)):
                    started = time.perf_counter()
                    metrics["val/loss"] = self.validate()
                    metrics["timing_s/testing"] = time.perf_counter() - started
                if tracking is not None:
                    tracking.log(metrics, self.global_step)
                if last or (t.save_freq > 0 and self.global_step % t.save_freq == 0):
                    with self.stops.step():  # a stop signal waits for the checkpoint (docs/reliability.md)
                        self.stops.hold(f"checkpoint global_step_{self.global_step} is saved")
                        self.save_checkpoint()
                if on_step is not None:
                    on_step(self.global_step, metrics)
        self.save_final_hf()
        return metrics

    def save_final_hf(self) -> Path:
        """Write the weights and tokenizer to ``<default_local_dir>/final_hf`` (``from_pretrained`` folder;
        collective for a sharded engine, whose rank 0 writes it)."""
        from verl.trainer.sft_ranks import barrier

        out = self.run_dir / FINAL_HF_DIR
        self.engine.save_hf(out, tokenizer=self.tokenizer)
        barrier(self.world)
        return out


def run_sft(config_path: str | None, overrides: Sequence[str] = ()) -> dict[str, float]:
    """Load the config (:func:`verl.config.sft_loader.load_sft_config`) and train; returns the last metrics."""
    from verl.config.sft_loader import load_sft_config

    return SFTTrainer(load_sft_config(config_path, overrides)).fit()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verl.trainer.sft_trainer [CONFIG.yaml] [key=value ...]``: the ``verl sft`` command."""
    from verl.cli.main import main as verl_main

    return verl_main(["sft", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
