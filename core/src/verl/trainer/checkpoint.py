"""Run checkpoints laid out as verl's trainer does (anatomy §3.8), saved so that a crash never costs the last one.

Layout under ``default_local_dir``: ``global_step_{N}/`` holding named parts — ``actor/`` (an engine's files:
:mod:`verl.engines.reference.checkpoint_files` for the reference engine), optional ``critic/``, ``data.json``
(dataloader state), ``trainer_state.json`` (step, RNG state, ...) and ``manifest.json`` (every file's size and
sha256, and the checkpoint's health: :mod:`verl.trainer.checkpoint_manifest`) — and
``latest_checkpointed_iteration.txt`` (verl's tracker: the bare step number), written LAST. Nothing in a checkpoint
is a pickle of arbitrary objects (:mod:`verl.engines.safe_files`); the old pickle format is refused by name and
converted by ``verl checkpoint convert`` (:mod:`verl.trainer.checkpoint_convert`).

Save protocol (known-failures K18): parts are written into ``global_step_{N}.tmp-<pid>`` beside the final
folder, the manifest is written, every file and folder is fsynced, the folder is renamed to ``global_step_{N}`` (atomic on POSIX), the
tracker is replaced atomically (temp file + ``os.replace``), and only then are old checkpoints rotated out.
Rotation renames a folder to ``global_step_{N}.del-<pid>`` before deleting it, so an interrupted delete never
leaves a half folder that looks like a checkpoint; it never removes the newest healthy checkpoint (finite weights,
not every update since the previous checkpoint skipped) in favour of unhealthy newer ones. Scratch folders of dead
processes (``.tmp-``, ``.del-``, ``.old-``) are cleaned when a manager starts.

Resume verifies the manifest; ``resume_mode=auto`` falls back to the newest checkpoint that verifies (naming each
one skipped and why), ``resume_path`` stops on a checkpoint that does not, and so does ``auto`` when none does.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from verl.engines.safe_files import (  # noqa: F401 - re-exported: the checkpoint errors live in the lower layer
    CheckpointError,
    CheckpointFileError,
    LegacyCheckpointError,
    NonFiniteCheckpointError,
    load_weights_only,
    read_json,
    save_weights_only,
    write_json,
)
from verl.trainer import faults
from verl.trainer.checkpoint_fs import discard, fsync_dir, fsync_tree, pid_alive, remove_tree
from verl.trainer.checkpoint_manifest import (  # noqa: F401 - re-exported
    MANIFEST_FILE,
    CheckpointHealth,
    CheckpointVerifyError,
    drop_from_manifest,
    read_health,
    verify_checkpoint,
    write_manifest,
)
from verl.trainer.checkpoint_resume import (  # noqa: F401 - re-exported
    STEP_DIR,
    CheckpointNotFoundError,
    CheckpointResumeError,
    CheckpointUnusableError,
    newest_verified,
    parse_global_step,
)
from verl.trainer.rng_state import capture_rng_state, restore_rng_state  # noqa: F401 - re-exported

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RESUME_MODES = ("disable", "auto", "resume_path")
PART_STATE_FILE = "state.pt"  # weights-only torch file inside a folder part given as an object (no suffix in its name)

_SCRATCH_DIR = re.compile(r"^(global_step_\d+)\.(tmp|old|del)-(\d+)$")

PartWriter = Callable[[Path], None]


class CheckpointSaveError(CheckpointError, RuntimeError):
    """Saving ``step`` failed; the previous checkpoint and tracker are untouched. ``__cause__`` is the error.

    ``path`` is the checkpoint folder that was being written (named in the message when given).
    """

    def __init__(self, step: int, reason: str, path: str | os.PathLike[str] | None = None):
        self.step = step
        self.path = None if path is None else Path(path)
        target = f"global_step_{step}" if path is None else os.fspath(path)
        super().__init__(
            f"saving checkpoint {target} failed while {reason}; the previous checkpoint and "
            f"{TRACKER_FILE} were left unchanged"
        )


def first_step_after_resume(saved_index: int, sync_interval: int = 1) -> int:
    """The first training step to run after resuming from checkpoint index ``saved_index`` (K17 a/b).

    verl counts steps from 1 and saves *after* a step completes, so a checkpoint named ``global_step_100``
    holds the state after step 100 and training resumes at step 101 — not 102. In the asynchronous modes the
    saved index counts parameter-sync versions, each ``sync_interval`` local steps long, so the step counter
    resumes at ``saved_index * sync_interval + 1`` (100 versions x 4 -> 401). ``sync_interval=1`` is the
    synchronous trainer.

    Raises:
        ValueError: ``saved_index < 0`` or ``sync_interval < 1`` (or non-int values).
    """
    for name, value, low in (("saved_index", saved_index, 0), ("sync_interval", sync_interval, 1)):
        if not _is_int(value) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return saved_index * sync_interval + 1


def load_part(checkpoint_path: str | os.PathLike[str], name: str, *, weights_only: bool = True) -> Any:
    """Load a part written by :meth:`CheckpointManager.save` from an object.

    ``name`` ending in ``.json`` is read as JSON; another name with a suffix is a weights-only torch file; a name
    without one (``"actor"``) is that folder's ``state.pt`` (weights-only). Nothing is unpickled as arbitrary
    objects: ``weights_only=False`` is refused.

    Raises:
        CheckpointNotFoundError: the part is missing (the message lists the parts present).
        CheckpointFileError: the file is truncated, corrupt or not data only (names the file).
        ValueError: ``weights_only=False``.
    """
    if not weights_only:
        raise ValueError("load_part(weights_only=False) is not supported: checkpoints are data, never pickles")
    root = Path(checkpoint_path)
    target = root / name
    if target.is_dir():
        target = target / PART_STATE_FILE
    if not target.is_file():
        present = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise CheckpointNotFoundError(f"checkpoint {root} has no part {name!r} ({target} missing); present: {present}")
    if target.suffix == ".json":
        return read_json(target, expect=object)
    return load_weights_only(target)


class CheckpointManager:
    """Save, find, resume and rotate ``global_step_N`` checkpoints under one run directory.

    Args:
        default_local_dir: the run's checkpoint folder (verl ``trainer.default_local_dir``); created if missing.
        max_ckpt_to_keep: keep this many newest complete checkpoints (verl ``trainer.max_actor_ckpt_to_keep``),
            plus the newest healthy one (:attr:`CheckpointHealth.healthy`) when none of them is; ``None`` or ``0``
            keeps all. Checkpoints already on disk count (K18b: a resumed run rotates out the checkpoint it resumed
            from once a newer one is safely saved); their health is read from their manifests.
        part_limits: ``{part name: N}``: keep that part (e.g. ``"critic"``, verl ``trainer.max_critic_ckpt_to_keep``)
            only in the newest ``N`` kept checkpoints, deleting it from older ones after each save, as verl's
            per-role checkpoint managers do; ``None``/``0`` keeps it wherever its checkpoint is kept. A
            checkpoint whose part was pruned cannot resume that role.

    Single writer: one process (the trainer driver) saves into a directory at a time. Raises ValueError for a
    negative or non-int ``max_ckpt_to_keep``.
    """

    def __init__(
        self,
        default_local_dir: str | os.PathLike[str],
        max_ckpt_to_keep: int | None = None,
        part_limits: Mapping[str, int | None] | None = None,
    ):
        limits = {
            "max_ckpt_to_keep": max_ckpt_to_keep,
            **{f"part_limits[{k!r}]": v for k, v in (part_limits or {}).items()},
        }
        for name, value in limits.items():
            if value is not None and not (_is_int(value) and value >= 0):
                raise ValueError(f"{name} must be None or an int >= 0 (0/None: keep all), got {value!r}")
        self.part_limits = {k: v for k, v in (part_limits or {}).items() if v}
        self.root = Path(os.path.abspath(os.path.expanduser(os.fspath(default_local_dir))))
        self.max_ckpt_to_keep = max_ckpt_to_keep
        self.root.mkdir(parents=True, exist_ok=True)
        self._cleanup_scratch()
        # rotation order: checkpoints found on disk (oldest step first), then this process's saves in save order
        self._tracked: list[int] = [step for step, _ in self._scan()]
        self._health: dict[int, CheckpointHealth | None] = {}  # this process's saves; older ones read from disk

    @property
    def tracker_path(self) -> Path:
        return self.root / TRACKER_FILE

    @property
    def tracked_steps(self) -> list[int]:
        """Steps considered for rotation, oldest first (a copy)."""
        return list(self._tracked)

    def step_dir(self, step: int) -> Path:
        return self.root / f"global_step_{step}"

    # ------------------------------------------------------------------ save
    def save(
        self,
        step: int,
        parts: Mapping[str, PartWriter | Any],
        health: CheckpointHealth | Callable[[], CheckpointHealth | None] | None = None,
    ) -> Path:
        """Write checkpoint ``step`` and its manifest atomically, then the tracker, then rotate; returns
        ``global_step_{step}``.

        Args:
            step: the global step just completed (int >= 0).
            parts: ``{relative name: writer or object}``. A callable gets the target path
                (``<tmp>/<name>``, parent created) and writes a file or folder there. An object is written as
                JSON to a ``.json`` name, else as a weights-only torch file (tensors and plain data only) to
                ``<name>`` when the name has another suffix, or to ``<name>/state.pt`` (``"actor"``). Read back
                with :func:`load_part`.
            health: recorded in the manifest; rotation keeps the newest healthy checkpoint. A callable is called
                after every part is written (the writers can report what they saw). ``None``: unknown.

        A checkpoint already named ``global_step_{step}`` is replaced only after the new one is complete.

        Raises:
            CheckpointSaveError: any failure while writing, syncing, renaming or writing the tracker (the
                message names the step, the part and the cause); the temp folder is removed and the previous
                checkpoint and tracker are untouched. Rotation failures are logged, not raised.
            TypeError / ValueError: bad ``step``, empty ``parts`` or a bad part name (nothing written).
        """
        if not _is_int(step) or step < 0:
            raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
        if not isinstance(parts, Mapping) or not parts:
            raise ValueError(f"parts must be a non-empty mapping {{name: writer or object}}, got {parts!r}")
        for name, part in parts.items():
            _check_part(name, part)

        final = self.step_dir(step)
        tmp = self.root / f"{final.name}.tmp-{os.getpid()}"
        current: str | None = None
        stage = "creating the temp folder"
        try:
            remove_tree(tmp)  # left by an earlier failed attempt of this same process
            tmp.mkdir()
            for index, (name, part) in enumerate(parts.items()):
                current = name
                _write_part(tmp / name, part)
                if index == 0:
                    faults.check("checkpoint_write", step)  # test-only; a no-op unless VERL_FAULT_INJECT is set
            current = None
            stage = "recording health"
            recorded = health() if callable(health) else health
            stage = f"writing {MANIFEST_FILE}"
            write_manifest(tmp, step=step, health=recorded)
            stage = "syncing files to disk"
            fsync_tree(tmp)
        except BaseException as exc:
            remove_tree(tmp, quiet=True)
            if not isinstance(exc, Exception):
                raise
            where = f"writing part {current!r}" if current is not None else stage
            raise CheckpointSaveError(step, f"{where}: {type(exc).__name__}: {exc}", final) from exc

        self._publish(step, tmp, final)
        self._health[step] = recorded
        logger.info("saved checkpoint %s", final)
        self._rotate(step)
        return final

    def _publish(self, step: int, tmp: Path, final: Path) -> None:
        displaced: Path | None = None
        published = False
        stage = "renaming the temp folder into place"
        try:
            if final.exists():
                displaced = self.root / f"{final.name}.old-{os.getpid()}"
                remove_tree(displaced)
                os.rename(final, displaced)
            os.rename(tmp, final)
            published = True
            fsync_dir(self.root)
            stage = f"writing {TRACKER_FILE}"
            self._write_tracker(step)
        except BaseException as exc:
            # roll back so the previous tracker and the folder it names stay the authoritative checkpoint
            remove_tree(final if published else tmp, quiet=True)
            if displaced is not None and displaced.exists() and not final.exists():
                os.rename(displaced, final)
            if not isinstance(exc, Exception):
                raise
            raise CheckpointSaveError(step, f"{stage}: {type(exc).__name__}: {exc}", final) from exc
        if displaced is not None:
            remove_tree(displaced, quiet=True)

    def _write_tracker(self, step: int) -> None:
        tmp = self.root / f"{TRACKER_FILE}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(str(step))  # verl's format: the bare number
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.tracker_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.root)

    def _rotate(self, saved_step: int) -> None:
        if saved_step in self._tracked:
            self._tracked.remove(saved_step)
        self._tracked.append(saved_step)
        self._prune_parts()
        if not self.max_ckpt_to_keep:
            return
        doomed = self._tracked[: -self.max_ckpt_to_keep]
        kept = self._tracked[-self.max_ckpt_to_keep :]
        if doomed and not any(self._healthy(step) for step in kept):
            # The N newest are all unhealthy (non-finite weights, or every update since the previous checkpoint
            # skipped): keep the newest healthy one on top of them, or a diverged run would rotate it away.
            spare = next((step for step in reversed(doomed) if self._healthy(step)), None)
            if spare is not None:
                doomed.remove(spare)
                logger.warning(
                    "keeping %s beyond max_ckpt_to_keep=%d: it is the newest healthy checkpoint, the %d newest are "
                    "not (%s)",
                    self.step_dir(spare),
                    self.max_ckpt_to_keep,
                    len(kept),
                    "; ".join(f"global_step_{s}: {self._describe(s)}" for s in kept),
                )
        for step in doomed:
            path = self.step_dir(step)
            try:
                discard(path)
            except OSError as exc:
                logger.warning("could not remove old checkpoint %s (kept, will retry next save): %s", path, exc)
                continue
            self._tracked.remove(step)
            logger.info("removed old checkpoint %s (max_ckpt_to_keep=%d)", path, self.max_ckpt_to_keep)

    def health(self, step: int) -> CheckpointHealth | None:
        """The health recorded for checkpoint ``step`` (from this process's save, else its manifest); ``None``:
        unknown (no manifest, or saved without health)."""
        if step not in self._health:
            self._health[step] = read_health(self.step_dir(step))
        return self._health[step]

    def _healthy(self, step: int) -> bool:
        health = self.health(step)
        return health is not None and health.healthy

    def _describe(self, step: int) -> str:
        health = self.health(step)
        return "health unknown" if health is None else health.describe()

    def _prune_parts(self) -> None:
        """Drop each limited part from all but the newest ``limit`` checkpoints holding it (renamed aside first,
        so an interrupted delete never leaves a half part under its own name)."""
        for part, limit in self.part_limits.items():
            holding = [step for step in self._tracked if (self.step_dir(step) / part).exists()]
            for step in holding[:-limit]:
                path = self.step_dir(step) / part
                aside = path.with_name(f"{part}.del-{os.getpid()}")
                try:
                    if (self.step_dir(step) / MANIFEST_FILE).is_file():
                        drop_from_manifest(self.step_dir(step), part)  # first: never a manifest listing lost files
                    os.rename(path, aside)
                    remove_tree(aside)
                except (OSError, CheckpointFileError) as exc:
                    logger.warning("could not remove old %s part %s (kept, will retry next save): %s", part, path, exc)
                    continue
                logger.info("removed %s from old checkpoint %s (limit %d)", part, self.step_dir(step), limit)

    # ------------------------------------------------------------------ find / resume
    def latest(self) -> tuple[int, Path] | None:
        """``(step, path)`` named by the tracker; without a usable tracker, the newest complete
        ``global_step_N`` folder (never a ``.tmp-`` folder); ``None`` when there is no checkpoint."""
        step = self._read_tracker()
        if step is not None:
            path = self.step_dir(step)
            if path.is_dir():
                return step, path
            logger.warning("%s names step %d but %s is missing; using the newest folder", TRACKER_FILE, step, path)
        found = self._scan()
        return found[-1] if found else None

    def resolve_resume(
        self, resume_mode: str, resume_from_path: str | os.PathLike[str] | None = None
    ) -> tuple[int, Path] | None:
        """Which checkpoint to resume from (verl ``trainer.resume_mode`` / ``trainer.resume_from_path``), verified.

        ``"disable"`` -> ``None``. ``"auto"`` -> the newest checkpoint whose manifest verifies
        (:func:`~verl.trainer.checkpoint_manifest.verify_checkpoint`), trying the tracker's first, then the other
        ``global_step_N`` folders newest first; each one skipped (damaged, old pickle format, or recorded with
        non-finite weights) is logged with the file and the reason; ``None`` (train from scratch) only when there is
        no checkpoint at all. ``"resume_path"`` -> ``(parse_global_step(path), path)`` once it verifies, relative
        paths taken from the current directory. The first step to run is then :func:`first_step_after_resume` of
        the returned step.

        Raises:
            CheckpointResumeError: unknown mode, ``resume_path`` without a path, or a path whose last component
                is not ``global_step_N`` (K17c). CheckpointNotFoundError: the path does not exist.
                CheckpointUnusableError: the ``resume_path`` checkpoint does not verify, or (``auto``) checkpoints
                exist and none verifies; it lists each folder with the file at fault.
        """
        if resume_mode not in RESUME_MODES:
            raise CheckpointResumeError(f"trainer.resume_mode={resume_mode!r} is not one of {list(RESUME_MODES)}")
        if resume_mode == "disable":
            return None
        if resume_mode == "auto":
            # A resume_from_path given with auto is ignored, as in verl; config validation warns about it once.
            return self._newest_verified()  # None = from scratch; the trainer says so once (several callers ask)
        if not resume_from_path:
            raise CheckpointResumeError(
                "resume_mode='resume_path' needs trainer.resume_from_path=<dir>/global_step_<N>"
            )
        path = Path(os.path.abspath(os.path.expanduser(os.fspath(resume_from_path))))
        step = parse_global_step(path)
        if not path.is_dir():
            raise CheckpointNotFoundError(
                f"trainer.resume_from_path={os.fspath(resume_from_path)!r}: checkpoint folder {path} does not exist"
            )
        try:
            verify_checkpoint(path)
        except CheckpointFileError as exc:
            raise CheckpointUnusableError(path.parent, [(path, str(exc))]) from exc
        return step, path

    def _candidates(self) -> list[tuple[int, Path]]:
        """Checkpoints to try in ``auto`` mode: the tracker's, then every other ``global_step_N``, newest first."""
        found = list(reversed(self._scan()))
        step = self._read_tracker()
        tracked = [(s, p) for s, p in found if s == step]
        return tracked + [(s, p) for s, p in found if s != step]

    def _newest_verified(self) -> tuple[int, Path] | None:
        return newest_verified(self.root, self._candidates())

    def _read_tracker(self) -> int | None:
        try:
            text = self.tracker_path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        try:
            return int(text)
        except ValueError:
            logger.warning("ignoring %s with unreadable content %r", self.tracker_path, text[:50])
            return None

    def _scan(self) -> list[tuple[int, Path]]:
        matches = ((STEP_DIR.match(entry.name), entry) for entry in self.root.iterdir())
        return sorted((int(m.group(1)), entry) for m, entry in matches if m is not None and entry.is_dir())

    def _cleanup_scratch(self) -> None:
        for entry in sorted(self.root.iterdir()):
            match = _SCRATCH_DIR.match(entry.name)
            if match is None or not entry.is_dir():
                continue
            final_name, kind, pid = match.group(1), match.group(2), int(match.group(3))
            if pid_alive(pid):
                logger.warning("leaving %s: process %d is alive (another run saving into %s?)", entry, pid, self.root)
                continue
            final = self.root / final_name
            if kind == "old" and not final.exists():
                # a replaced checkpoint whose replacement never got published: it is still the good one
                os.rename(entry, final)
                logger.warning("restored %s from %s left by killed process %d", final, entry.name, pid)
                continue
            remove_tree(entry, quiet=True)
            logger.warning("removed stale checkpoint scratch folder %s left by killed process %d", entry, pid)


# ---------------------------------------------------------------------- filesystem helpers
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_part(name: Any, part: Any) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"checkpoint part names must be non-empty strings, got {name!r}")
    rel = Path(name)
    if rel.is_absolute() or any(p in ("..", ".") for p in rel.parts) or "\\" in name:
        raise ValueError(f"checkpoint part name {name!r} must be a relative path inside the step folder, like 'actor'")
    if rel.parts[0] == MANIFEST_FILE:
        raise ValueError(f"checkpoint part name {name!r} is taken: the manager writes {MANIFEST_FILE} itself")
    if isinstance(part, torch.nn.Module):
        raise TypeError(f"checkpoint part {name!r} is an nn.Module; pass module.state_dict() or a writer function")


def _write_part(target: Path, part: Any) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if callable(part):
        part(target)
        if not target.exists():
            raise FileNotFoundError(f"the writer of part {target.name!r} returned without creating {target}")
    elif target.suffix == ".json":
        write_json(target, part)
    elif target.suffix:
        save_weights_only(target, part)
    else:
        target.mkdir()
        save_weights_only(target / PART_STATE_FILE, part)
