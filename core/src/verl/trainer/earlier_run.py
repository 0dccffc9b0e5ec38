"""Keep an earlier run's outputs when a fresh run starts in the same folder.

A run that resumes from ``global_step_S`` continues the earlier run: ``metrics.jsonl`` keeps its rows up to
``S`` (:meth:`verl.trainer.tracking.Tracking.rewind`). A run that starts from scratch (no checkpoint to
resume, or ``trainer.resume_mode=disable``) would rewind that file to zero rows, replace ``final_hf/`` and
``config.yaml``, overwrite the per-step sample files and rotate out the old checkpoints: the earlier run
would be lost. Instead, before anything is written, its outputs are renamed beside themselves with a time
stamp, ``metrics.jsonl`` -> ``metrics.<YYYYmmdd-HHMMSS>.jsonl``, ``final_hf/`` -> ``final_hf.<stamp>/``,
``rollouts/`` -> ``rollouts.<stamp>/``, ... (a rename: nothing is copied or deleted), and the caller says so
on the console.

A run that resumes keeps the folder's outputs, but writes its own resolved ``config.yaml``. When its settings
differ from the ``config.yaml`` already there (changed overrides on resume), :func:`keep_changed_config` renames
the earlier file to ``config.<stamp>.yaml`` first, so the settings the earlier steps ran with stay on disk.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

#: Files and folders of a run folder that hold a run's results (``config.yaml`` moves with them).
# wandb/ and swanlog/ are where the trackers write offline runs inside the run folder.
RUN_OUTPUTS = ("metrics.jsonl", "metrics.png", "val_generations.jsonl", "final_hf", "tensorboard", "wandb", "swanlog")
CONFIG_FILE = "config.yaml"


def needs_fresh_start(config: Any) -> bool:
    """Whether the run will start from scratch: ``resume_mode`` finds no checkpoint to resume.

    Args:
        config: the resolved :class:`verl.config.RootConfig`.

    Raises:
        CheckpointResumeError / CheckpointNotFoundError: a bad ``resume_mode`` or ``resume_from_path``
            (:meth:`verl.trainer.checkpoint.CheckpointManager.resolve_resume`).
    """
    from verl.trainer.checkpoint import CheckpointManager

    trainer = config.trainer
    manager = CheckpointManager(trainer.default_local_dir)
    return manager.resolve_resume(trainer.resume_mode, trainer.resume_from_path) is None


def set_aside_earlier_run(
    run_dir: str | os.PathLike[str], config: Any, *, stamp: str | None = None
) -> list[tuple[Path, Path]]:
    """Rename an earlier run's outputs aside if this run starts from scratch; returns ``[(old, new), ...]``.

    Moved when present and not empty: :data:`RUN_OUTPUTS` in ``run_dir``, the ``trainer.rollout_data_dir``
    and ``trainer.validation_data_dir`` folders, and the checkpoints under ``trainer.default_local_dir``
    (``resume_mode=disable`` would otherwise rotate them out); ``config.yaml`` goes along with any of them.
    A run that resumes moves nothing.

    Args:
        run_dir: the run folder (``--run-dir``).
        config: the resolved :class:`verl.config.RootConfig`.
        stamp: suffix to use (default: local time ``YYYYmmdd-HHMMSS``); a taken name gets ``-2``, ``-3``, ...

    Raises:
        CheckpointResumeError: as :func:`needs_fresh_start`.
    """
    run_dir = Path(run_dir)
    if not needs_fresh_start(config):
        return []
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    trainer = config.trainer
    candidates = [run_dir / name for name in RUN_OUTPUTS]
    candidates += [Path(p).expanduser() for p in (trainer.rollout_data_dir, trainer.validation_data_dir) if p]
    candidates += _checkpoint_entries(Path(trainer.default_local_dir).expanduser(), run_dir)
    moved = [(path, _rename_aside(path, stamp)) for path in dict.fromkeys(candidates) if _holds_data(path)]
    if moved and (run_dir / CONFIG_FILE).is_file():
        moved.append((run_dir / CONFIG_FILE, _rename_aside(run_dir / CONFIG_FILE, stamp)))
    return moved


def keep_changed_config(run_dir: str | os.PathLike[str], config: Any, *, stamp: str | None = None) -> Path | None:
    """Rename ``<run_dir>/config.yaml`` to ``config.<stamp>.yaml`` if its settings differ from ``config``.

    Call it just before writing the new resolved config (:func:`verl.config.save_resolved_config`). Settings are
    compared as parsed YAML, so the ``#`` header lines (the base config's description) do not count; a file
    that does not parse counts as different (it is kept rather than overwritten).

    Args:
        run_dir: the run folder.
        config: the resolved :class:`verl.config.RootConfig` about to be written.
        stamp: suffix to use (default: local time ``YYYYmmdd-HHMMSS``); a taken name gets ``-2``, ``-3``, ...

    Returns:
        The new path of the earlier file, or None (no earlier file, or the same settings).
    """
    from verl.config.dump import to_yaml
    from verl.config.yaml_io import load_yaml

    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        earlier = load_yaml(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):  # unreadable as YAML: keep it aside rather than lose it
        earlier = None
    if earlier == load_yaml(to_yaml(config)):
        return None
    return _rename_aside(path, stamp or time.strftime("%Y%m%d-%H%M%S"))


def set_aside_outputs(run_dir: str | os.PathLike[str], *, stamp: str | None = None) -> list[tuple[Path, Path]]:
    """Rename aside what a run that starts from scratch in ``run_dir`` would overwrite; returns ``[(old, new)]``.

    For trainers whose run folder is also their checkpoint root (``verl sft``): :data:`RUN_OUTPUTS`, the
    ``global_step_N`` checkpoints with their tracker file, and ``config.yaml`` (with any of them), each renamed
    to ``<name>.<stamp>`` as :func:`set_aside_earlier_run` does. The caller decides that the run is fresh.

    Raises:
        FileExistsError: no free ``<name>.<stamp>-N`` name (N up to 999).
    """
    run_dir = Path(run_dir)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    candidates = [run_dir / name for name in RUN_OUTPUTS] + _checkpoint_entries(run_dir, run_dir)
    moved = [(path, _rename_aside(path, stamp)) for path in candidates if _holds_data(path)]
    if moved and (run_dir / CONFIG_FILE).is_file():
        moved.append((run_dir / CONFIG_FILE, _rename_aside(run_dir / CONFIG_FILE, stamp)))
    return moved


def _checkpoint_entries(root: Path, run_dir: Path) -> list[Path]:
    """The checkpoint root itself, or its ``global_step_N`` entries when the root holds the run folder."""
    from verl.trainer.checkpoint import TRACKER_FILE

    if not root.is_dir():
        return []
    steps = [p for p in root.iterdir() if p.name.startswith("global_step_") and p.is_dir()]
    if not steps:
        return []
    absolute_root, absolute_run = root.resolve(), run_dir.resolve()
    if absolute_run == absolute_root or absolute_root in absolute_run.parents:
        return [*sorted(steps), root / TRACKER_FILE]
    return [root]


def _holds_data(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.is_file() and path.stat().st_size > 0


def _rename_aside(path: Path, stamp: str) -> Path:
    """``metrics.jsonl`` -> ``metrics.<stamp>.jsonl``, ``rollouts`` -> ``rollouts.<stamp>`` (first free name)."""
    stem, suffix = (path.stem, path.suffix) if path.is_file() else (path.name, "")
    for n in range(1, 1000):
        target = path.with_name(f"{stem}.{stamp}{'' if n == 1 else f'-{n}'}{suffix}")
        if not target.exists():
            os.rename(path, target)
            return target
    raise FileExistsError(f"no free name to move {path} aside (tried {stem}.{stamp}-N{suffix} up to 999)")
