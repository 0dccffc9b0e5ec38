"""Where a run writes: its run folder, its checkpoints, and the sample folders that follow the run folder.

* run folder: ``--run-dir``, default ``runs/<trainer.project_name>/<trainer.experiment_name>``
  (:func:`default_run_dir`): ``config.yaml``, ``metrics.jsonl``, ``final_hf/``.
* checkpoints: ``trainer.default_local_dir``. When ``--run-dir`` is given and the key is left unset
  (base, file and overrides), it is ``<run_dir>/checkpoints``, so resume looks only inside that run
  folder; without ``--run-dir`` it is verl's ``checkpoints/<project_name>/<experiment_name>``
  (:mod:`verl.config.resolve`). An explicit value always wins.
* ``trainer.rollout_data_dir`` / ``trainer.validation_data_dir`` given by a shipped run config inside its
  own run folder (``runs/verl_gsm8k/grpo_smollm2_cpu/rollouts``) move with the run folder when it differs
  (``--run-dir``, another project or experiment name), so two runs never write into one sample folder.
  A value from the file or an override stays as written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

#: ``<run_dir>/checkpoints`` holds a ``--run-dir`` run's ``global_step_N/`` folders.
RUN_CHECKPOINTS_SUBDIR = "checkpoints"
FOLLOWING_KEYS = ("rollout_data_dir", "validation_data_dir")


def default_run_dir(project_name: str, experiment_name: str) -> Path:
    """``runs/<project_name>/<experiment_name>`` (relative to the current directory)."""
    return Path("runs") / project_name / experiment_name


def follow_run_dir(
    tree: dict[str, Any],
    origins: Mapping[str, str],
    run_dir: str | os.PathLike[str] | None,
    base_tree: Mapping[str, Any],
) -> None:
    """Apply the module's rules to a merged plain config tree, in place (before structuring).

    Args:
        tree: base <- file <- overrides, as plain dicts.
        origins: dotted keys set by the file or an override (what the user wrote).
        run_dir: the ``--run-dir`` given, or ``None`` (then only the sample folders may move, following
            the project/experiment name).
        base_tree: the base run config's own tree (``{}`` for the bare schema).
    """
    trainer = tree.setdefault("trainer", {})
    if run_dir is not None and trainer.get("default_local_dir") is None:
        trainer["default_local_dir"] = os.fspath(Path(run_dir) / RUN_CHECKPOINTS_SUBDIR)
    base_trainer = base_tree.get("trainer") or {}
    if not base_trainer:
        return
    actual = PurePath(run_dir) if run_dir is not None else _run_dir_of(trainer)
    base_run = _run_dir_of(base_trainer)
    if actual == base_run:
        return
    for key in FOLLOWING_KEYS:
        value, base_value = trainer.get(key), base_trainer.get(key)
        if f"trainer.{key}" in origins or not isinstance(value, str) or value != base_value:
            continue
        try:
            inside = PurePath(value).relative_to(base_run)
        except ValueError:  # the base writes it elsewhere: not part of its run folder
            continue
        trainer[key] = os.fspath(actual / inside)


def _run_dir_of(trainer: Mapping[str, Any]) -> PurePath:
    from verl.config.schema import TrainerConfig

    defaults = TrainerConfig()
    return default_run_dir(
        str(trainer.get("project_name") or defaults.project_name),
        str(trainer.get("experiment_name") or defaults.experiment_name),
    )
