"""Which checkpoint a run resumes from: the resume errors, the step of a ``global_step_N`` path, and the choice of the
newest checkpoint that verifies (:mod:`verl.trainer.checkpoint_manifest`). :class:`~verl.trainer.checkpoint.
CheckpointManager` uses them; :mod:`verl.trainer.checkpoint` re-exports everything public here."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from verl.engines.safe_files import CheckpointError, CheckpointFileError
from verl.trainer.checkpoint_manifest import CheckpointHealth, verify_checkpoint

__all__ = [
    "CheckpointNotFoundError",
    "CheckpointResumeError",
    "CheckpointUnusableError",
    "newest_verified",
    "parse_global_step",
]

logger = logging.getLogger("verl.trainer.checkpoint")

STEP_DIR = re.compile(r"^global_step_(\d+)$")
_SAID: set[str] = set()  # warnings given already: the CLI, then the trainer, resolve the same checkpoints


def _warn_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        logger.warning("%s", message)


class CheckpointResumeError(CheckpointError, ValueError):
    """Bad ``resume_mode`` / ``resume_from_path`` (e.g. a last path component that is not ``global_step_N``)."""


class CheckpointNotFoundError(CheckpointResumeError, FileNotFoundError):
    """A checkpoint folder or part that was asked for does not exist."""


class CheckpointUnusableError(CheckpointResumeError):
    """No checkpoint that resume may use verifies; ``problems`` is ``[(folder, reason), ...]``, newest first.

    Raised by ``resume_mode=resume_path`` when its folder fails verification and by ``auto`` when checkpoints exist
    but none verifies (never a silent start from scratch over them). ``__cause__`` is the newest one's error.
    """

    def __init__(self, root: str | os.PathLike[str], problems: list[tuple[Path, str]]):
        self.root = Path(root)
        self.problems = list(problems)
        listed = "; ".join(f"{folder.name}: {reason}" for folder, reason in self.problems)
        super().__init__(
            f"no checkpoint under {self.root} can be resumed: {listed}. Fix or remove the damaged folders, resume "
            "another with trainer.resume_mode=resume_path trainer.resume_from_path=<dir>/global_step_<N>, or start "
            "from scratch with trainer.resume_mode=disable (the checkpoints are then renamed aside, not deleted)"
        )

    def __reduce__(self):
        return (type(self), (self.root, self.problems))


def parse_global_step(path: str | os.PathLike[str]) -> int:
    """Step number of a checkpoint folder, from its LAST path component only (K17c).

    ``".../global_step_900/archive/global_step_12"`` -> ``12``; a trailing slash is ignored.

    Raises:
        CheckpointResumeError: the last component is not exactly ``global_step_<digits>``.
    """
    name = Path(os.fspath(path)).name
    match = STEP_DIR.match(name)
    if match is None:
        raise CheckpointResumeError(
            f"checkpoint path {os.fspath(path)!r}: its last component {name!r} is not 'global_step_<N>'; "
            "point trainer.resume_from_path at the global_step_<N> folder itself"
        )
    return int(match.group(1))


def newest_verified(root: str | os.PathLike[str], candidates: list[tuple[int, Path]]) -> tuple[int, Path] | None:
    """The first of ``candidates`` (``[(step, folder)]``, in order of preference) that verifies and was not saved
    with non-finite weights; each one passed over is logged with its reason.

    Returns:
        ``(step, folder)``, or ``None`` when ``candidates`` is empty.

    Raises:
        CheckpointUnusableError: candidates exist and none can be used (lists each with its reason).
    """
    if not candidates:
        return None
    problems: list[tuple[Path, str]] = []
    errors: list[Exception] = []
    for step, path in candidates:
        try:
            manifest = verify_checkpoint(path)
        except CheckpointFileError as exc:
            problems.append((path, str(exc)))
            errors.append(exc)
            _warn_once(f"not resuming from {path}: {exc}")
            continue
        health = CheckpointHealth.from_json(manifest.get("health"))
        if health is not None and health.weights_finite is False:
            reason = f"it was saved with {health.describe()}"
            problems.append((path, reason))
            _warn_once(f"not resuming from {path}: {reason}")
            continue
        if problems:
            skipped = "; ".join(f"{folder.name} ({reason})" for folder, reason in problems)
            _warn_once(f"resuming from {path}, the newest checkpoint that verifies; skipped {skipped}")
        if health is not None and not health.healthy:
            _warn_once(f"resuming from {path} although {health.describe()}")
        return step, path
    raise CheckpointUnusableError(root, problems) from (errors[0] if errors else None)
