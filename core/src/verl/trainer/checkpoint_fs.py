"""Filesystem steps of the checkpoint protocol (:mod:`verl.trainer.checkpoint`): fsync, removal that never leaves a
half ``global_step_N`` behind, and whether the process that left a scratch folder is alive."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

__all__ = ["discard", "fsync_dir", "fsync_tree", "pid_alive", "remove_tree"]

logger = logging.getLogger("verl.trainer.checkpoint")


def fsync_dir(path: Path) -> None:
    # best effort: some platforms/network filesystems cannot open or fsync a folder; renames stay atomic there
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            fd = os.open(os.path.join(dirpath, filename), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def remove_tree(path: Path, quiet: bool = False) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
    except OSError as exc:
        if not quiet:
            raise
        logger.warning("could not remove %s: %s", path, exc)


def discard(path: Path) -> None:
    """Delete a checkpoint folder so that no partial ``global_step_N`` can survive an interruption."""
    if not path.exists():
        return
    trash = path.with_name(f"{path.name}.del-{os.getpid()}")
    remove_tree(trash)
    os.rename(path, trash)
    remove_tree(trash, quiet=True)


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this manager is only starting: nothing of ours is in flight
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # exists, owned by another user
    except (OverflowError, ValueError, OSError):
        return False  # ProcessLookupError: no such process
    return True
