"""``verl checkpoint convert``: rewrite a checkpoint of the old pickle format as data files with a manifest.

Before checkpoints were data only, ``global_step_N/`` held ``torch.save`` pickles: ``data.pt`` (the sampler state,
or the SFT loop state), ``trainer_state.pt`` (step, RNG state, KL coefficient) and, per training-engine part,
``model_world_size_{W}_rank_{R}.pt`` (or ``state.pt``: the reference engine's whole state dict). Resume refuses
them (:class:`~verl.engines.safe_files.LegacyCheckpointError`), because unpickling runs whatever the file says.

Converting loads those pickles with the unsafe loader — only when the user says they trust the files
(``trust_pickle=True``, ``--trust-pickle``) — and writes, in a scratch folder beside the checkpoint:
``data.json``, ``trainer_state.json`` (RNG state as :func:`~verl.trainer.rng_state.rng_state_to_json` data), each
engine part as :mod:`verl.engines.reference.checkpoint_files`, every other file copied as it is (a sharded engine's
DCP shards, ``huggingface/``, ``checkpoint.json``), and a manifest. Every new file is read back and compared with
what the pickle held before anything is replaced. Then the old folder is renamed aside and the new one into place
(the checkpoint protocol's ``.old-<pid>`` / ``.tmp-<pid>`` names, so a killed conversion is undone by the next run),
and the old folder is deleted, or kept as ``global_step_N.legacy-pickle`` with ``keep_old=True``.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl.engines.reference.checkpoint_files import load_engine_state, save_engine_state
from verl.engines.safe_files import CheckpointError, nonfinite_tensors, read_json, write_json
from verl.trainer.checkpoint_fs import fsync_dir, fsync_tree, remove_tree
from verl.trainer.checkpoint_manifest import (
    MANIFEST_FILE,
    CheckpointHealth,
    legacy_files,
    verify_checkpoint,
    write_manifest,
)
from verl.trainer.checkpoint_resume import STEP_DIR, parse_global_step
from verl.trainer.rng_state import rng_state_from_json, rng_state_to_json

__all__ = ["ConvertError", "ConvertResult", "convert_checkpoint", "convert_checkpoints"]

logger = logging.getLogger("verl.trainer.checkpoint")

LEGACY_SUFFIX = ".legacy-pickle"
_RANK_FILE = "model_world_size_{}_rank_{}.pt"


class ConvertError(CheckpointError, ValueError):
    """A checkpoint cannot be converted (not trusted, not a checkpoint, unexpected content); nothing was changed."""


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert_checkpoint` did to one ``global_step_N`` folder.

    Attributes:
        folder: the checkpoint folder.
        converted: the pickle files rewritten (relative paths); empty when it was already in the new format.
        kept: where the old folder was kept (``keep_old=True``), else ``None``.
    """

    folder: Path
    converted: list[str]
    kept: Path | None = None


def convert_checkpoints(
    path: str | os.PathLike[str], *, trust_pickle: bool, keep_old: bool = False
) -> list[ConvertResult]:
    """Convert ``path`` (a ``global_step_N`` folder) or every ``global_step_N`` folder under it (a checkpoint root).

    Raises:
        ConvertError: as :func:`convert_checkpoint`, or ``path`` holds no checkpoint at all.
    """
    path = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if STEP_DIR.match(path.name):
        return [convert_checkpoint(path, trust_pickle=trust_pickle, keep_old=keep_old)]
    folders = sorted(
        (p for p in path.iterdir() if p.is_dir() and STEP_DIR.match(p.name)) if path.is_dir() else [],
        key=lambda p: parse_global_step(p),
    )
    if not folders:
        raise ConvertError(f"{path} is neither a global_step_<N> folder nor a folder holding some")
    return [convert_checkpoint(folder, trust_pickle=trust_pickle, keep_old=keep_old) for folder in folders]


def convert_checkpoint(folder: str | os.PathLike[str], *, trust_pickle: bool, keep_old: bool = False) -> ConvertResult:
    """Rewrite one ``global_step_N`` folder of the old pickle format in place (see the module doc).

    Args:
        folder: the ``global_step_N`` folder.
        trust_pickle: the user's word that the pickle files are theirs; without it nothing is loaded.
        keep_old: keep the old folder as ``global_step_N.legacy-pickle`` instead of deleting it.

    Returns:
        what was done; a folder that already has a manifest is verified and left as it is.

    Raises:
        ConvertError: ``trust_pickle`` is false (the message lists the pickle files), no such folder, nothing to
            convert, a pickle holding something other than what verl wrote, or a read-back mismatch.
        CheckpointFileError: a folder already in the new format does not verify.
        OSError: the disk refused a write or a rename (the original folder is then left in place).
    """
    folder = Path(os.path.abspath(os.fspath(folder)))
    step = parse_global_step(folder)
    if not folder.is_dir():
        raise ConvertError(f"checkpoint folder {folder} does not exist")
    if (folder / MANIFEST_FILE).is_file():
        verify_checkpoint(folder)
        return ConvertResult(folder, [])
    pickles = legacy_files(folder)
    if not pickles:
        raise ConvertError(f"{folder} has neither {MANIFEST_FILE} nor old-format pickle files: nothing to convert")
    names = [p.relative_to(folder).as_posix() for p in pickles]
    if not trust_pickle:
        raise ConvertError(
            f"{folder} holds pickle files ({', '.join(names)}); converting loads them, and loading a pickle runs any "
            "code written into it. Convert only a checkpoint your own run wrote, and say so with --trust-pickle "
            "(convert_checkpoint(..., trust_pickle=True))"
        )
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    remove_tree(tmp)
    try:
        shutil.copytree(folder, tmp, ignore=_skip(set(pickles)))
        nonfinite: list[str] = []
        for pickle_file in pickles:
            nonfinite += _convert_file(pickle_file, tmp / pickle_file.relative_to(folder).parent)
        health = CheckpointHealth(weights_finite=not nonfinite, nonfinite=nonfinite)
        write_manifest(tmp, step=step, health=health)
        fsync_tree(tmp)
    except BaseException:
        remove_tree(tmp, quiet=True)
        raise
    kept = _swap(folder, tmp, keep_old)
    logger.info("converted %s (%s) to the data-only format", folder, ", ".join(names))
    return ConvertResult(folder, names, kept)


def _skip(pickles: set[Path]):
    def ignore(directory: str, names: list[str]) -> list[str]:
        return [name for name in names if Path(directory, name) in pickles]

    return ignore


def _load_pickle(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)  # the user vouched for this file
    except Exception as exc:
        raise ConvertError(f"cannot read {path} (truncated or corrupt?): {type(exc).__name__}: {exc}") from exc


def _convert_file(path: Path, target_dir: Path) -> list[str]:
    """Write the new-format files of one pickle into ``target_dir``; returns non-finite tensor names found."""
    obj = _load_pickle(path)
    if path.name in ("data.pt", "trainer_state.pt"):
        if not isinstance(obj, dict):
            raise ConvertError(f"{path} holds a {type(obj).__name__}, not the dict verl wrote")
        data = dict(obj)
        if "rng" in data:
            data["rng"] = rng_state_to_json(data["rng"])
        target = target_dir / (Path(path.name).stem + ".json")
        write_json(target, data)
        back = read_json(target)
        if "rng" in back:
            _same_rng(path, obj["rng"], rng_state_from_json(back["rng"]))
            back["rng"], data["rng"] = None, None
        if back != data:
            raise ConvertError(f"{target} does not read back as {path} held it")
        return []
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        raise ConvertError(f"{path} is not a training engine's state dict ({{'model': ..., ...}})")
    world, rank = _world_rank(path)
    save_engine_state(target_dir, obj, world, rank)
    back = load_engine_state(target_dir, world, rank)
    _same_state(path, obj, back)
    return [f"{path.parent.name}:{name}" for name in nonfinite_tensors(obj["model"].items())]


def _world_rank(path: Path) -> tuple[int, int]:
    if path.name == "state.pt":
        return 1, 0
    parts = path.stem.split("_")  # model_world_size_{W}_rank_{R}
    return int(parts[3]), int(parts[5])


def _same_rng(path: Path, before: Any, after: Any) -> None:
    if rng_state_to_json(before) != rng_state_to_json(after):
        raise ConvertError(f"the RNG state of {path} does not read back unchanged")


def _same_state(path: Path, before: dict[str, Any], after: dict[str, Any]) -> None:
    model_a, model_b = before["model"], after["model"]
    if set(model_a) != set(model_b) or any(not _same_tensor(model_a[k], model_b[k]) for k in model_a):
        raise ConvertError(f"the model tensors of {path} do not read back unchanged")
    for key in ("global_step", "skipped_steps"):
        if int(before.get(key, 0)) != after[key]:
            raise ConvertError(f"{key} of {path} does not read back unchanged")
    if "optimizer" in before and not _equal(before["optimizer"], after.get("optimizer")):
        raise ConvertError(f"the optimizer state of {path} does not read back unchanged")


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (a NaN read back as the same NaN is equal, unlike ``torch.equal``)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().cpu().reshape(-1).view(torch.uint8), b.detach().cpu().reshape(-1).view(torch.uint8))


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and _same_tensor(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def _swap(folder: Path, tmp: Path, keep_old: bool) -> Path | None:
    """Put ``tmp`` in the place of ``folder``: ``folder`` -> ``.old-<pid>``, ``tmp`` -> ``folder``, then drop or
    keep the old one. A kill in between leaves names the checkpoint manager repairs at the next start."""
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    remove_tree(old)
    os.rename(folder, old)
    try:
        os.rename(tmp, folder)
    except BaseException:
        os.rename(old, folder)
        remove_tree(tmp, quiet=True)
        raise
    fsync_dir(folder.parent)
    if not keep_old:
        remove_tree(old, quiet=True)
        return None
    kept = folder.with_name(folder.name + LEGACY_SUFFIX)
    index = 1
    while kept.exists():
        index += 1
        kept = folder.with_name(f"{folder.name}{LEGACY_SUFFIX}-{index}")
    os.rename(old, kept)
    return kept
