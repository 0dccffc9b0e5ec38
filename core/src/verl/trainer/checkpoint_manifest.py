"""The manifest of a checkpoint: ``global_step_N/manifest.json``, every file's size and sha256, and its health.

Written by :meth:`CheckpointManager.save <verl.trainer.checkpoint.CheckpointManager.save>` inside the temp folder
after every part, before the folder is renamed into place and before the tracker, so a published checkpoint always
has one. Resume verifies it (:func:`verify_checkpoint`): every listed file must exist with its size (all sizes are
checked first: a truncated file is found without hashing anything), then its sha256. A missing, truncated or
changed file, or an unreadable manifest, is a :class:`CheckpointVerifyError` naming the file.

The manifest guards against damage (a bad disk, a copy cut short, a killed ``rsync``), not against someone who can
write the folder: they could rewrite the manifest too. That is what :mod:`verl.engines.safe_files` is for: nothing
in a checkpoint is unpickled, so a planted file is at worst bad data that the loaders refuse.

Format (JSON)::

    {"format": "verl-checkpoint-manifest/1", "step": 12, "hash": "sha256",
     "files": {"actor/model_world_size_1_rank_0.safetensors": {"size": 538000000, "sha256": "9f2c..."}, ...},
     "health": {"weights_finite": true, "updates_applied": 4, "updates_skipped": 0, "nonfinite": []},
     "pruned": ["critic"]}

``health`` (or ``null`` when unknown) says whether the weights were finite when saved and how many optimizer updates
were applied / skipped for a non-finite grad norm since the previous checkpoint; rotation keeps the newest healthy
checkpoint (:attr:`CheckpointHealth.healthy`). ``pruned`` names parts removed later by ``max_critic_ckpt_to_keep``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl.engines.safe_files import CheckpointFileError, LegacyCheckpointError, read_json

__all__ = [
    "MANIFEST_FILE",
    "CheckpointHealth",
    "CheckpointVerifyError",
    "hash_file",
    "read_health",
    "verify_checkpoint",
    "write_manifest",
]

logger = logging.getLogger("verl.trainer.checkpoint")

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "verl-checkpoint-manifest/1"
#: Top-level files of the old pickle format; their presence without a manifest marks a legacy checkpoint.
LEGACY_TOP_FILES = ("data.pt", "trainer_state.pt")
_HASH_THREADS = 4  # hashlib releases the GIL on large buffers: files hash in parallel

# verified folders of this process: {folder: (stat signature, manifest or the hash mismatch found)}; a second resolve
# (the CLI's, then the trainer's) of an unchanged folder is free
_VERIFIED: dict[str, tuple[tuple[Any, ...], dict[str, Any] | CheckpointFileError]] = {}


class CheckpointVerifyError(CheckpointFileError):
    """A checkpoint failed verification; ``path`` is the file at fault (or the manifest), ``folder`` the checkpoint."""

    def __init__(self, path: str | os.PathLike[str], reason: str, folder: str | os.PathLike[str] | None = None):
        self.folder = Path(folder) if folder is not None else Path(path).parent
        super().__init__(path, reason)

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.folder))


@dataclass(frozen=True)
class CheckpointHealth:
    """What a checkpoint's weights were like when saved.

    Attributes:
        weights_finite: every parameter finite (``None``: not checked).
        updates_applied: optimizer updates applied since the previous checkpoint (``None``: unknown).
        updates_skipped: optimizer updates skipped for a non-finite grad norm since then (``None``: unknown).
        nonfinite: names of non-finite parameters (rank-qualified), when any.
    """

    weights_finite: bool | None = None
    updates_applied: int | None = None
    updates_skipped: int | None = None
    nonfinite: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """Finite weights, and not a checkpoint whose every update since the previous one was skipped."""
        all_skipped = bool(self.updates_skipped) and self.updates_applied == 0
        return self.weights_finite is True and not all_skipped

    def describe(self) -> str:
        """One line for logs: why it is (not) healthy."""
        if self.weights_finite is False:
            return f"non-finite weights ({', '.join(self.nonfinite[:4]) or 'unnamed'})"
        if self.weights_finite is None:
            return "health unknown"
        if self.updates_skipped and self.updates_applied == 0:
            return f"all {self.updates_skipped} optimizer updates since the previous checkpoint were skipped"
        return "healthy"

    def to_json(self) -> dict[str, Any]:
        return {
            "weights_finite": self.weights_finite,
            "updates_applied": self.updates_applied,
            "updates_skipped": self.updates_skipped,
            "nonfinite": list(self.nonfinite),
        }

    @classmethod
    def from_json(cls, value: Any) -> CheckpointHealth | None:
        """Parse the manifest's ``health`` entry; ``None`` for ``null`` or a malformed entry (unknown health)."""
        if not isinstance(value, Mapping):
            return None
        finite = value.get("weights_finite")
        applied, skipped = value.get("updates_applied"), value.get("updates_skipped")
        names = value.get("nonfinite") or []
        if finite not in (True, False, None) or not all(_opt_count(v) for v in (applied, skipped)):
            return None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        return cls(finite, applied, skipped, list(names))


def _opt_count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def hash_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes (read in 8 MiB blocks)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _files(folder: Path) -> list[str]:
    """Relative POSIX paths of the files under ``folder`` (the manifest itself excluded), sorted."""
    found = []
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            rel = Path(dirpath, name).relative_to(folder).as_posix()
            if rel != MANIFEST_FILE and not name.startswith(f"{MANIFEST_FILE}.tmp-"):
                found.append(rel)
    return sorted(found)


def _hash_all(folder: Path, rels: list[str]) -> dict[str, str]:
    if not rels:
        return {}
    with ThreadPoolExecutor(max_workers=min(_HASH_THREADS, len(rels))) as pool:
        return dict(zip(rels, pool.map(lambda rel: hash_file(folder / rel), rels), strict=True))


def write_manifest(
    folder: str | os.PathLike[str],
    *,
    step: int,
    health: CheckpointHealth | None = None,
    pruned: list[str] | None = None,
) -> dict[str, Any]:
    """Hash every file under ``folder`` and write ``folder/manifest.json`` atomically (temp file, fsync, rename).

    Returns:
        the manifest written (a dict, as in the module doc).

    Raises:
        OSError: a file cannot be read or the manifest cannot be written.
    """
    folder = Path(folder)
    rels = _files(folder)
    digests = _hash_all(folder, rels)
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": int(step),
        "hash": "sha256",
        "files": {rel: {"size": (folder / rel).stat().st_size, "sha256": digests[rel]} for rel in rels},
        "health": None if health is None else health.to_json(),
        "pruned": sorted(pruned or []),
    }
    _write_atomic(folder / MANIFEST_FILE, manifest)
    _VERIFIED.pop(os.fspath(folder), None)
    return manifest


def drop_from_manifest(folder: str | os.PathLike[str], part: str) -> None:
    """Remove ``part/...`` entries from ``folder``'s manifest and record ``part`` as pruned (before the part's files
    are deleted, so an interruption leaves unlisted files, which verification ignores, never listed missing ones).

    Raises:
        CheckpointVerifyError: the manifest is missing or unreadable. OSError: it cannot be rewritten.
    """
    folder = Path(folder)
    manifest = _read_manifest(folder)
    prefix = f"{part}/"
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not (k == part or k.startswith(prefix))}
    manifest["pruned"] = sorted({*manifest.get("pruned", []), part})
    _write_atomic(folder / MANIFEST_FILE, manifest)
    _VERIFIED.pop(os.fspath(folder), None)


def _write_atomic(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def legacy_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Old-format pickle files of a checkpoint folder (``data.pt``, ``trainer_state.pt``, ``<part>/model_*.pt``)."""
    from verl.engines.reference.checkpoint_files import legacy_files as part_legacy

    folder = Path(folder)
    found = [folder / name for name in LEGACY_TOP_FILES if (folder / name).is_file()]
    for part in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        found.extend(part_legacy(part))
    return found


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_FILE
    if not path.is_file():
        legacy = legacy_files(folder)
        if legacy:
            others = [p.relative_to(folder).as_posix() for p in legacy[1:]]
            also = f" (as are {', '.join(others)})" if others else ""
            raise LegacyCheckpointError(
                legacy[0],
                f"is in the old pickle format{also} and {folder} has no {MANIFEST_FILE}; it is not loaded, because "
                "unpickling a file can run any code written into it. If you trust this checkpoint (your own run wrote "
                f"it), convert it with `verl checkpoint convert {folder} --trust-pickle` and resume again",
            )
        raise CheckpointVerifyError(
            path, f"is missing: {folder} is not a complete verl checkpoint (or was written by other software)", folder
        )
    try:
        manifest = read_json(path)
    except CheckpointFileError as exc:
        raise CheckpointVerifyError(path, exc.reason, folder) from exc
    files = manifest.get("files")
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
        raise CheckpointVerifyError(path, f"is not a {MANIFEST_FORMAT} manifest", folder)
    for rel, entry in files.items():
        ok = isinstance(entry, dict) and _opt_count(entry.get("size")) and entry.get("size") is not None
        if not ok or not isinstance(entry.get("sha256"), str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointVerifyError(path, f"has a malformed entry for {rel!r}", folder)
    return manifest


def _signature(folder: Path, manifest: dict[str, Any]) -> tuple[Any, ...]:
    stats = []
    for rel in [MANIFEST_FILE, *sorted(manifest["files"])]:
        try:
            st = (folder / rel).stat()
        except OSError:
            return ()
        stats.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(stats)


def verify_checkpoint(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file the manifest of ``folder`` lists: present, its size, then its sha256.

    A folder verified (or found corrupt) before in this process whose files' size, mtime and inode are unchanged is
    not hashed again.
    Files the manifest does not list are logged and ignored (no loader reads them).

    Returns:
        the manifest (dict).

    Raises:
        LegacyCheckpointError: no manifest, and old-format pickle files present (names the convert command).
        CheckpointVerifyError: no or unreadable manifest, or a file missing, of the wrong size (truncated) or
            with another sha256 (corrupt); the message names the file and what differs.
    """
    folder = Path(os.path.abspath(os.fspath(folder)))
    manifest = _read_manifest(folder)
    signature = _signature(folder, manifest)
    cached = _VERIFIED.get(os.fspath(folder))
    if signature and cached is not None and cached[0] == signature:
        if isinstance(cached[1], CheckpointFileError):
            raise CheckpointVerifyError(cached[1].path, cached[1].reason, folder)
        return cached[1]
    files: dict[str, dict[str, Any]] = manifest["files"]
    for rel, entry in sorted(files.items()):  # sizes first: a cut-short copy is found without hashing
        path = folder / rel
        if not path.is_file():
            raise CheckpointVerifyError(path, f"is missing (listed in {MANIFEST_FILE})", folder)
        size = path.stat().st_size
        if size != entry["size"]:
            cut = " (truncated)" if size < entry["size"] else ""
            raise CheckpointVerifyError(path, f"has {size} bytes, {MANIFEST_FILE} says {entry['size']}{cut}", folder)
    digests = _hash_all(folder, sorted(files))
    for rel, digest in digests.items():
        if digest != files[rel]["sha256"]:
            error = CheckpointVerifyError(
                folder / rel, f"is corrupt: its sha256 {digest[:16]}... differs from {MANIFEST_FILE}'s", folder
            )
            _VERIFIED[os.fspath(folder)] = (signature, error)
            raise error
    extra = sorted(set(_files(folder)) - set(files))
    if extra:
        logger.warning("%s: files not in %s are ignored: %s", folder, MANIFEST_FILE, ", ".join(extra[:10]))
    _VERIFIED[os.fspath(folder)] = (signature, manifest)
    return manifest


def read_health(folder: str | os.PathLike[str]) -> CheckpointHealth | None:
    """The ``health`` recorded in ``folder``'s manifest, without verifying files; ``None`` when unknown."""
    try:
        manifest = _read_manifest(Path(folder))
    except CheckpointFileError:
        return None
    return CheckpointHealth.from_json(manifest.get("health"))
