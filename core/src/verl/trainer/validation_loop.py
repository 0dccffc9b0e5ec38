"""Validation: greedy (``val_kwargs``) generation on the validation set, rule rewards, verl's ``val-core`` metrics."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger("verl.trainer.ppo_trainer")


class ValidationLoop:
    """The validation pass of :class:`~verl.trainer.ppo_trainer.PPOTrainer` (a mixin)."""

    config: Any
    global_steps: int

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
