"""Supervised fine-tuning on chat data (verl ``verl/trainer/sft_trainer.py``): ``verl sft CONFIG k=v`` or
``python -m verl.trainer.sft_trainer CONFIG k=v``.

One optimizer step per ``data.train_batch_size`` rows through the RL actor's training engine
(:class:`~verl.engines.reference.training.ReferenceTrainingEngine`, micro-batches / token budget / packing as
for the actor) with :func:`verl.workers.losses.make_sft_loss`. Metrics use verl's names: ``train/loss``,
``train/grad_norm``, ``train/lr``, ``train/global_tokens``, ``train/total_tokens(B)``, ``val/loss`` (the mean
of the validation batches' token-mean NLL, verl's), plus ``timing_s/step`` and ``timing_s/testing`` (seconds). Checkpoints are ``<default_local_dir>/global_step_N/`` (the
engine state in ``actor/``, the sampler position and counters in ``data.pt``), written every ``save_freq``
steps and at the last step; ``resume_mode=auto`` continues from the newest one exactly (same batches, same
weights). At the end the weights and tokenizer are written to ``<default_local_dir>/final_hf/``, a HF folder
that loads as ``actor_rollout_ref.model.path`` of an RL run.
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
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class SFTTrainer:
    """Builds the datasets, the engine and the checkpoint manager of one SFT run; :meth:`fit` trains.

    Args:
        config: a validated :class:`SFTConfig` (:func:`verl.config.sft_loader.load_sft_config`).
        tokenizer: a HF tokenizer to use instead of loading ``model.tokenizer_path`` / ``model.path``.

    Raises:
        SFTRowError: a bad training/validation row (names file and row).
        ValueError: fewer training rows than ``data.train_batch_size``; a model that cannot be loaded.
    """

    def __init__(self, config: SFTConfig, *, tokenizer: Any = None) -> None:
        from verl.data.sampler import StatefulSampler
        from verl.data.sft_dataset import SFTDataset
        from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
        from verl.models.resolve import resolve_model_path
        from verl.trainer.checkpoint import CheckpointManager
        from verl.workers.losses import make_sft_loss

        self.config = cfg = config
        d, m, t = cfg.data, cfg.model, cfg.trainer
        model_path = resolve_model_path(m.path)
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
            raise ValueError(
                f"data.train_files hold {len(self.train_dataset)} rows, fewer than data.train_batch_size="
                f"{d.train_batch_size}: no full batch; lower the batch size or add rows"
            )
        self.sampler = StatefulSampler(
            len(self.train_dataset), d.train_batch_size, shuffle=d.shuffle, seed=t.seed, drop_last=True
        )
        self.steps_per_epoch = len(self.sampler)
        self.total_training_steps = t.total_training_steps or self.steps_per_epoch * t.total_epochs
        settings = EngineSettings(
            mini_batch_size=d.train_batch_size,
            micro_batch_size=d.micro_batch_size_per_gpu,
            use_dynamic_bsz=d.use_dynamic_bsz,
            max_token_len=d.max_token_len_per_gpu,
            infer_micro_batch_size=d.micro_batch_size_per_gpu,
            infer_use_dynamic_bsz=d.use_dynamic_bsz,
            infer_max_token_len=d.max_token_len_per_gpu,
            clip_grad=cfg.optim.clip_grad,
            dtype=_DTYPES[cfg.engine.model_dtype],
            gradient_checkpointing=m.enable_gradient_checkpointing,
            use_remove_padding=m.use_remove_padding,
            trust_remote_code=m.trust_remote_code,
            override_config=dict(m.override_config),
        )
        torch.manual_seed(t.seed)
        self.engine = ReferenceTrainingEngine(
            model_path,
            settings,
            optim=cfg.optim,
            total_training_steps=self.total_training_steps,
            device=torch.device(t.device),
        )
        self.engine.metric_prefix = "train"  # verl's SFT names: train/grad_norm, train/lr
        self.loss_fn = make_sft_loss()
        self.run_dir = Path(t.default_local_dir).expanduser()
        self.checkpoints = CheckpointManager(self.run_dir, t.max_ckpt_to_keep or None)
        self.global_step = 0
        self.total_tokens = 0

    # ------------------------------------------------------------------ batches

    def collate(self, items: Sequence[dict]) -> Any:
        """Rows -> the engine's batch (:func:`verl.data.sft_dataset.collate_sft`), padded per ``data.pad_mode``."""
        from verl.data.sft_dataset import collate_sft

        pad_to = self.config.data.max_length if self.config.data.pad_mode == "right" else None
        return collate_sft(items, self.pad_id, pad_to=pad_to)

    def _next_batch(self) -> Any:
        rows = self.sampler.remaining_batches()[0]
        self.sampler.advance(1)
        return self.collate([self.train_dataset[i] for i in rows])

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> float:
        """``val/loss``: mean over validation batches (``train_batch_size`` rows, the last one may be short) of
        each batch's token-mean NLL on its loss-mask tokens (verl averages the per-batch losses)."""
        assert self.val_dataset is not None
        size = self.config.data.train_batch_size
        losses = []
        for start in range(0, len(self.val_dataset), size):
            batch = self.collate([self.val_dataset[i] for i in range(start, min(start + size, len(self.val_dataset)))])
            log_probs = self.engine.compute_log_prob(batch).batch["old_log_probs"]
            mask = batch.batch["response_mask"].to(log_probs.dtype)
            if mask.sum() > 0:
                losses.append(float(-(log_probs * mask).sum() / mask.sum()))
        return sum(losses) / len(losses) if losses else math.nan

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self) -> Path:
        """Write ``global_step_{N}/`` (engine state in ``actor/``, loop state in ``data.pt``)."""
        from verl.trainer.rng_state import capture_rng_state

        loop = {
            "global_step": self.global_step,
            "total_tokens": self.total_tokens,
            "sampler": self.sampler.state_dict(),
            "rng": capture_rng_state(),
        }
        return self.checkpoints.save(self.global_step, {"actor": self.engine.state_dict(), "data.pt": loop})

    def resume(self) -> int:
        """Restore the checkpoint ``trainer.resume_mode`` picks; returns its step (0 = from scratch).

        Raises:
            CheckpointResumeError: bad resume settings or a missing checkpoint folder.
        """
        from verl.trainer.checkpoint import load_part
        from verl.trainer.rng_state import restore_rng_state

        t = self.config.trainer
        found = self.checkpoints.resolve_resume(t.resume_mode, t.resume_from_path)
        if found is None:
            return 0
        step, path = found
        self.engine.load_state_dict(load_part(path, "actor"))
        loop = load_part(path, "data.pt")
        self.sampler.load_state_dict(loop["sampler"])
        restore_rng_state(loop["rng"])
        self.global_step = int(loop["global_step"])
        self.total_tokens = int(loop["total_tokens"])
        logger.info("resumed SFT from %s (step %d)", path, step)
        return step

    # ------------------------------------------------------------------ loop

    def fit(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
        """Train to ``total_training_steps`` (resuming first); returns the last step's metrics.

        Args:
            on_step: called as ``on_step(step, metrics)`` after each step's checkpoint (tests stop a run there).
        """
        from verl.config.dump import to_dict, to_yaml
        from verl.trainer.earlier_run import set_aside_outputs
        from verl.trainer.tracking import Tracking

        t = self.config.trainer
        if self.resume() == 0:
            # A fresh run would rewind metrics.jsonl and replace final_hf/: keep the earlier run's files.
            for old, moved in set_aside_outputs(self.run_dir):
                logger.warning("earlier run's %s kept as %s", old, moved.name)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(self.config), encoding="utf-8")
        metrics: dict[str, float] = {}
        with Tracking(
            t.project_name,
            t.experiment_name,
            backends=t.logger,
            run_dir=self.run_dir,
            config_dict=to_dict(self.config),
            total_steps=self.total_training_steps,
        ) as tracking:
            tracking.rewind(self.global_step)
            while self.global_step < self.total_training_steps:
                started = time.perf_counter()
                batch = self._next_batch()
                raw = self.engine.train_batch(batch, self.loss_fn)
                step_s = time.perf_counter() - started
                self.global_step += 1
                metrics = {k: sum(v) / len(v) for k, v in raw.items() if v}
                tokens = int(batch.batch["attention_mask"].sum())
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
                tracking.log(metrics, self.global_step)
                if last or (t.save_freq > 0 and self.global_step % t.save_freq == 0):
                    self.save_checkpoint()
                if on_step is not None:
                    on_step(self.global_step, metrics)
        self.save_final_hf()
        return metrics

    def save_final_hf(self) -> Path:
        """Write the weights and tokenizer to ``<default_local_dir>/final_hf`` (``from_pretrained`` folder)."""
        out = self.run_dir / FINAL_HF_DIR
        self.engine.save_hf(out, tokenizer=self.tokenizer)
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
