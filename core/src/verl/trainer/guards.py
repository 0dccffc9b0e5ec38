"""Run-level guards of the training loop: stop a run whose optimizer steps keep being skipped.

The training engine skips an optimizer step whose global grad norm is NaN/inf (the weights stay finite) and counts
it in ``actor/skipped_steps`` (cumulative). One skipped step is noise; a long streak means the run is diverging
(learning rate too high, a bad batch, a broken custom loss or reward) or its weights are already non-finite, and
every further step is wasted compute. :class:`NonFiniteStepGuard` keeps the number of consecutive skipped optimizer
steps and trips when it exceeds ``trainer.max_nonfinite_steps``; the trainer then saves a checkpoint (every bad update
was skipped, so the weights are those of the last applied update) and stops with :class:`NonFiniteStepsError`.

Two cases the limit alone would let end as "done": a process that resumes for fewer steps than the limit (every
restart began a new streak) and a run whose every update was skipped but that ends before the streak passes the
limit. So a resumed guard continues the streak the run's ``metrics.jsonl`` shows at the resumed step
(:meth:`NonFiniteStepGuard.resume`), and a run that reaches its last step without this process applying a single
optimizer step (:attr:`NonFiniteStepGuard.nothing_applied`) stops with the same error instead of ending as "done".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl.trainer.tracking import step_ranges

__all__ = ["NonFiniteStepGuard", "NonFiniteStepsError"]

logger = logging.getLogger(__name__)


class NonFiniteStepsError(RuntimeError):
    """Too many consecutive optimizer steps were skipped for a non-finite grad norm; the run was stopped.

    Attributes:
        streak: consecutive skipped optimizer steps when the run stopped.
        limit: ``trainer.max_nonfinite_steps``.
        steps: training steps (``global_steps``) that contained skipped optimizer steps of the streak.
        checkpoint: folder of the checkpoint saved before stopping, or ``None``.
        at_end: ``True`` when the run reached its last step with every update of this process skipped (the streak
            did not pass the limit); ``False`` when the streak passed the limit.
    """

    def __init__(
        self, streak: int, limit: int, steps: Sequence[int], checkpoint: str | None, at_end: bool = False
    ) -> None:
        self.streak = streak
        self.limit = limit
        self.steps = list(steps)
        self.checkpoint = checkpoint
        self.at_end = at_end
        saved = f"; checkpoint of the weights the run stopped with: {checkpoint}" if checkpoint else ""
        where = step_ranges(self.steps) or "none"
        if at_end:
            what = (
                f"the run reached its last step, but every optimizer step of this process was skipped for a "
                f"non-finite (NaN/inf) grad norm ({streak} consecutive, training steps {where}; "
                f"trainer.max_nonfinite_steps={limit}), so it changed nothing and is not reported as done{saved}. "
                "If the weights it resumed from are non-finite, resume from an earlier checkpoint "
                "(trainer.resume_mode=resume_path); otherwise the loss or its gradient is NaN/inf:"
            )
        else:
            what = (
                f"{streak} consecutive optimizer steps had a non-finite (NaN/inf) grad norm and were skipped, more "
                f"than trainer.max_nonfinite_steps={limit} (training steps {where}){saved}. The loss or its "
                "gradient is NaN/inf:"
            )
        super().__init__(
            f"{what} lower actor_rollout_ref.actor.optim.lr, check the data and rewards of those steps "
            "(trainer.rollout_data_dir dumps them) and any custom loss or reward function, then resume; "
            "trainer.max_nonfinite_steps=null disables this check."
        )

    def __reduce__(self):
        return (type(self), (self.streak, self.limit, self.steps, self.checkpoint, self.at_end))


def _floats(values: Any) -> list[float]:
    if values is None:
        return []
    if isinstance(values, (int, float)):
        return [float(values)]
    return [float(v) for v in values]


class NonFiniteStepGuard:
    """Counts consecutive skipped optimizer steps from the metrics ``update_actor`` returns.

    Args:
        max_nonfinite_steps: trip when the streak exceeds this (>= 1); ``None`` never trips (still counts).

    Raises:
        ValueError: ``max_nonfinite_steps`` is not ``None`` and < 1.
    """

    def __init__(self, max_nonfinite_steps: int | None) -> None:
        if max_nonfinite_steps is not None and int(max_nonfinite_steps) < 1:
            raise ValueError(
                f"trainer.max_nonfinite_steps={max_nonfinite_steps!r} must be >= 1 (consecutive skipped optimizer "
                "steps before the run stops) or null for no limit"
            )
        self.limit = None if max_nonfinite_steps is None else int(max_nonfinite_steps)
        self.streak = 0
        self.streak_steps: list[int] = []
        self._cumulative: float | None = None
        #: Optimizer updates of this process applied / skipped so far (checkpoint health: a checkpoint whose every
        #: update since the previous one was skipped is not the one rotation may keep alone). ``updates_applied``
        #: is a lower bound (1 per training step) for an engine that reports no ``actor/grad_norm``.
        self.updates_applied = 0
        self.updates_skipped = 0
        self.observed = 0  # update_actor calls that reported skipped_steps, in this process

    @property
    def applied_any(self) -> bool:
        """Whether this process applied at least one optimizer update."""
        return self.updates_applied > 0

    @property
    def tripped(self) -> bool:
        """True once the streak exceeds the limit."""
        return self.limit is not None and self.streak > self.limit

    @property
    def nothing_applied(self) -> bool:
        """True when this process ran updates and skipped every optimizer step of them (with a limit set).

        Checked by the trainer at the run's last step: such a run changed nothing and must not end as "done"."""
        return self.limit is not None and self.observed > 0 and not self.applied_any and self.streak > 0

    def resume(self, rows: Sequence[Mapping[str, Any]], step: int) -> None:
        """Continue the streak of the run resumed at ``step``, from its ``metrics.jsonl`` rows.

        The row of ``step`` gives ``actor/nonfinite_streak``; the training steps of the streak are that row and
        the rows just before it whose streak is also > 0. Without that row (or the key) the streak starts at 0.
        """
        by_step = {row.get("step"): row for row in rows}
        value = by_step.get(step, {}).get("actor/nonfinite_streak")
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return
        steps = []
        s = step
        while isinstance(streak := by_step.get(s, {}).get("actor/nonfinite_streak"), (int, float)) and streak > 0:
            steps.append(s)
            s -= 1
        self.streak, self.streak_steps = int(value), sorted(steps)
        logger.warning(
            "resumed at step %d with %d consecutive skipped optimizer steps (training steps %s; limit %s)",
            step,
            self.streak,
            step_ranges(self.streak_steps),
            self.limit,
        )

    def observe(self, raw_metrics: Mapping[str, Any], step: int) -> dict[str, float]:
        """Update the streak from one ``update_actor`` call; returns ``{"actor/nonfinite_streak": streak}``.

        Args:
            raw_metrics: ``update_actor``'s ``meta_info["metrics"]`` before reduction: ``actor/skipped_steps``
                (one cumulative count per data-parallel rank) and, when present, ``actor/grad_norm`` (one value per
                optimizer step, rank after rank) which orders the skips inside the step.
            step: the training step these metrics belong to (``global_steps`` after the update).

        Without ``actor/skipped_steps`` (an engine that does not count) the streak is left unchanged.
        """
        counts = _floats(raw_metrics.get("actor/skipped_steps"))
        if not counts:
            return {"actor/nonfinite_streak": float(self.streak)}
        cumulative = max(counts)
        norms = _floats(raw_metrics.get("actor/grad_norm"))
        per_rank = len(norms) // len(counts) if len(norms) % len(counts) == 0 else 0
        ordered = norms[:per_rank]  # the grad norm is global: every rank saw the same sequence
        if self._cumulative is None:  # first step of this process (maybe resumed): no earlier count to diff
            self._cumulative = cumulative - sum(1 for v in ordered if not math.isfinite(v))
        skipped = int(round(cumulative - self._cumulative))
        self._cumulative = cumulative
        self.observed += 1
        self.updates_skipped += max(skipped, 0)
        if ordered:
            self.updates_applied += sum(1 for v in ordered if math.isfinite(v))
        elif skipped <= 0:
            self.updates_applied += 1
        if skipped <= 0:
            self.streak, self.streak_steps = 0, []
        elif ordered and skipped < len(ordered):  # some updates were applied: only the trailing skips count
            trailing = 0
            for value in reversed(ordered):
                if math.isfinite(value):
                    break
                trailing += 1
            self.streak, self.streak_steps = trailing, [step] if trailing else []
        else:  # every optimizer step of this training step was skipped (or the order is unknown)
            self.streak += skipped
            self.streak_steps.append(step)
        if skipped > 0:
            logger.warning(
                "step %d: %d optimizer step(s) skipped for a non-finite grad norm; %d consecutive (limit %s)",
                step,
                skipped,
                self.streak,
                self.limit,
            )
        return {"actor/nonfinite_streak": float(self.streak)}

    def stop(self, save_checkpoint: Callable[[], Any] | None) -> NonFiniteStepsError:
        """The error to raise once :attr:`tripped` (or, at the last step, :attr:`nothing_applied`); calls
        ``save_checkpoint()`` (returns the folder) first.

        A failing save is logged and the error is still returned (the run must stop either way).
        """
        checkpoint = None
        if save_checkpoint is not None:
            try:
                checkpoint = str(save_checkpoint())
            except Exception as exc:  # noqa: BLE001 - report the stop, with the save failure in the log
                logger.error("saving a checkpoint before stopping on non-finite steps failed: %s", exc)
        at_end = not self.tripped
        return NonFiniteStepsError(self.streak, self.limit or 0, self.streak_steps, checkpoint, at_end=at_end)
