"""The reference engine's checkpoint files (``global_step_N/actor/`` or ``critic/``), one set per rank.

:meth:`ReferenceTrainingEngine.state_dict` is split by kind, so that nothing is unpickled when it is read back
(:mod:`verl.engines.safe_files`), with verl's per-rank names and safe suffixes:

* ``model_world_size_{W}_rank_{R}.safetensors``: the model (with LoRA only the adapter), HF parameter names;
* ``optim_world_size_{W}_rank_{R}.pt``: ``{"optimizer", "lr_scheduler"}`` state dicts, read with
  ``torch.load(weights_only=True)`` (only when the engine trains);
* ``extra_state_world_size_{W}_rank_{R}.json``: ``{"format", "lora", "global_step", "skipped_steps"}``.

The old format (before checkpoints were data only) was one ``torch.save`` pickle, ``model_world_size_{W}_rank_{R}.pt``
(or ``state.pt`` from early SFT runs); it is refused with :class:`LegacyCheckpointError`, which names
``verl checkpoint convert``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from verl.engines.safe_files import (
    CheckpointFileError,
    LegacyCheckpointError,
    load_tensors,
    load_weights_only,
    read_json,
    save_tensors,
    save_weights_only,
    write_json,
)

FORMAT = "verl-reference/2"
#: File names of the old pickle format (``{W}``/``{R}``: world size, rank); the SFT trainer once wrote ``state.pt``.
LEGACY_PATTERNS = ("model_world_size_*_rank_*.pt", "state.pt")


def model_file(folder: str | os.PathLike[str], world_size: int, rank: int) -> Path:
    """``folder/model_world_size_{W}_rank_{R}.safetensors``."""
    return Path(folder) / f"model_world_size_{world_size}_rank_{rank}.safetensors"


def optim_file(folder: str | os.PathLike[str], world_size: int, rank: int) -> Path:
    """``folder/optim_world_size_{W}_rank_{R}.pt`` (weights-only torch file)."""
    return Path(folder) / f"optim_world_size_{world_size}_rank_{rank}.pt"


def extra_file(folder: str | os.PathLike[str], world_size: int, rank: int) -> Path:
    """``folder/extra_state_world_size_{W}_rank_{R}.json``."""
    return Path(folder) / f"extra_state_world_size_{world_size}_rank_{rank}.json"


def legacy_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The old-format pickle files in ``folder`` (sorted; empty for a new-format folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted({p for pattern in LEGACY_PATTERNS for p in folder.glob(pattern) if p.is_file()})


def save_engine_state(folder: str | os.PathLike[str], state: dict[str, Any], world_size: int, rank: int) -> None:
    """Write :meth:`ReferenceTrainingEngine.state_dict` output as this rank's three files (see the module doc).

    Raises:
        KeyError: ``state`` has no ``"model"``. TypeError: a model value that is not a tensor, or optimizer state
            holding other objects than tensors and plain data.
    """
    folder = Path(folder)
    save_tensors(model_file(folder, world_size, rank), state["model"])
    if "optimizer" in state:
        optim = {"optimizer": state["optimizer"], "lr_scheduler": state.get("lr_scheduler")}
        save_weights_only(optim_file(folder, world_size, rank), optim)
    extra = {
        "format": FORMAT,
        "lora": bool(state.get("lora", False)),
        "global_step": int(state.get("global_step", 0)),
        "skipped_steps": int(state.get("skipped_steps", 0)),
    }
    write_json(extra_file(folder, world_size, rank), extra)


def load_engine_state(folder: str | os.PathLike[str], world_size: int, rank: int) -> dict[str, Any]:
    """Read what :func:`save_engine_state` wrote, as a state dict for ``ReferenceTrainingEngine.load_state_dict``.

    Raises:
        LegacyCheckpointError: the folder holds the old pickle format instead (names ``verl checkpoint convert``).
        CheckpointFileError: a file is missing (saved with another world size? the message lists what is there),
            truncated, corrupt, or holds fields of the wrong type (each names the file).
    """
    folder = Path(folder)
    extra_path = extra_file(folder, world_size, rank)
    if not extra_path.is_file():
        legacy = legacy_files(folder)
        if legacy:
            raise LegacyCheckpointError(legacy[0])
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else "no such folder"
        raise CheckpointFileError(
            extra_path,
            f"is missing (saved with another world size? this run has world_size={world_size}); present: {present}",
        )
    extra = read_json(extra_path)
    if extra.get("format") != FORMAT:
        raise CheckpointFileError(extra_path, f"has format {extra.get('format')!r}, expected {FORMAT!r}")
    for key in ("global_step", "skipped_steps"):
        if not isinstance(extra.get(key), int) or isinstance(extra.get(key), bool) or extra[key] < 0:
            raise CheckpointFileError(extra_path, f"field {key!r} must be an int >= 0, got {extra.get(key)!r}")
    if not isinstance(extra.get("lora"), bool):
        raise CheckpointFileError(extra_path, f"field 'lora' must be true or false, got {extra.get('lora')!r}")
    state: dict[str, Any] = {
        "model": load_tensors(model_file(folder, world_size, rank)),
        "lora": extra["lora"],
        "global_step": extra["global_step"],
        "skipped_steps": extra["skipped_steps"],
    }
    optim_path = optim_file(folder, world_size, rank)
    if optim_path.is_file():
        optim = load_weights_only(optim_path)
        if not isinstance(optim, dict) or not isinstance(optim.get("optimizer"), dict):
            raise CheckpointFileError(optim_path, "does not hold {'optimizer': state dict, 'lr_scheduler': ...}")
        state["optimizer"] = optim["optimizer"]
        state["lr_scheduler"] = optim.get("lr_scheduler")
    return state


def has_engine_state(folder: str | os.PathLike[str], world_size: int, rank: int) -> bool:
    """Whether ``folder`` holds this rank's new-format files (its ``extra_state_*.json``)."""
    return extra_file(folder, world_size, rank).is_file()
