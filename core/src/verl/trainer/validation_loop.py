"""Validation: greedy (``val_kwargs``) generation on the validation set, rule rewards, verl's ``val-core`` metrics.

A step's validation runs after its row is in ``metrics.jsonl`` and is merged into that row; a row holding
``timing_s/testing`` is complete. A resumed step whose row lacks the validation it was due gets it first.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

from verl.trainer import faults
from verl.trainer.metrics import marked_timer
from verl.workers.switching import reduce_rank_metrics

logger = logging.getLogger("verl.trainer.ppo_trainer")


class ValidationLoop:
    """The validation pass of :class:`~verl.trainer.ppo_trainer.PPOTrainer` (a mixin)."""

    config: Any
    global_steps: int
    total_training_steps: int
    final_metrics: dict[str, Any]

    def _validation_due(self, step: int) -> bool:
        """verl's schedule: every ``trainer.test_freq`` steps and at the last step (``test_freq`` > 0)."""
        freq = self.config.trainer.test_freq
        return freq > 0 and (step % freq == 0 or step >= self.total_training_steps)

    def _validate_step(self) -> dict[str, Any]:
        """The validation of the step just logged, merged into its row; returns its metrics (``timing_s/testing``
        included: a row holding it is complete)."""
        faults.check("testing", self.global_steps)
        val: dict[str, Any] = {}
        with marked_timer("testing", timing := {}):
            if self.off_policy is not None:  # validate the updated weights, not the rollout's older ones
                val.update(reduce_rank_metrics(self.off_policy.sync(self.global_steps)))
            val.update(self.validate())
        val["timing_s/testing"] = timing["testing"]
        self.tracking.update(val, step=self.global_steps)
        return val

    def _complete_resumed_step(self, rows: list[dict[str, Any]] | None, *, last: bool) -> bool:
        """Run the validation the resumed step ``S`` was due but its row lacks (the process stopped during it).

        Mid-run (``last=False``) only a row that exists is completed (a missing row is the window between a
        checkpoint and its row, reported by :meth:`Tracking.rewind`); at the last step a missing row is written
        from the validation too, since a finished run must have its final validation. Needs the ``file`` logger
        (``rows``) and validation data. Returns whether the validation ran.
        """
        step = self.global_steps
        if rows is None or step == 0 or self.val_dataloader is None or not self._validation_due(step):
            return False
        row = next((r for r in reversed(rows) if r.get("step") == step), None)
        if row is None and not last:
            return False
        if row is not None and "timing_s/testing" in row:
            return False
        lost = "" if row is not None else "; its training metrics are lost (the process stopped before logging them)"
        print(
            f"verl train: step {step} has its checkpoint but its row in metrics.jsonl lacks the validation that was "
            f"due (the process stopped before it finished{lost}); running that validation now"
        )
        if last:
            self._start_generation()
        val = self._validate_step()
        self.final_metrics = {**(row or {}), **val}
        self.final_metrics.pop("step", None)
        return True

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
            self._reward(batch, self.val_reward_fn, metrics, context=f"validation at step {self.global_steps}")
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
