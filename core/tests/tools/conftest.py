"""Fixtures for the code interpreter's tests: the config of each isolation mode this machine can run."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from verl.tools.isolation import IsolationUnavailableError, resolve_isolation

#: A system interpreter every user can read: the bubblewrap box needs one when the trainer runs as root and its
#: own interpreter lives in a private folder (pyenv in root's home), since bwrap then runs as uid 65534.
SYSTEM_PYTHON = "/usr/bin/python3"


@functools.cache
def _box_config(mode: str) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """``(config items, None)`` for a working ``mode``, or ``((), why not)``."""
    try:
        resolve_isolation(mode, None)
        return (("isolation", mode),), None
    except (IsolationUnavailableError, ValueError) as first:
        reason = str(first)
    if mode == "bubblewrap" and os.geteuid() == 0 and os.path.exists(SYSTEM_PYTHON):
        try:
            resolve_isolation(mode, SYSTEM_PYTHON)
            return (("isolation", mode), ("python", SYSTEM_PYTHON)), None
        except (IsolationUnavailableError, ValueError) as second:
            reason += f"\nwith python={SYSTEM_PYTHON}: {second}"
    return (), reason


def box_config(mode: str) -> dict[str, str]:
    """The tool config keys that run ``mode`` here; skips the test (probed, with the reason) where it cannot."""
    if mode == "unsafe_none":
        return {"isolation": "unsafe_none"}
    items, reason = _box_config(mode)
    if reason is not None:
        pytest.skip(f"this machine cannot build a {mode} box: {reason}")
    return dict(items)


@pytest.fixture(params=["bubblewrap", "namespaces"])
def box(request: pytest.FixtureRequest) -> dict[str, str]:
    """Each box mode (skipped where this machine cannot build it)."""
    return box_config(request.param)


@pytest.fixture(params=["bubblewrap", "namespaces", "unsafe_none"])
def mode(request: pytest.FixtureRequest) -> dict[str, str]:
    """Each isolation mode, the opt-out included."""
    return box_config(request.param)


@pytest.fixture
def usable() -> dict[str, str]:
    """The default (``auto``) where this machine has a box, else the opt-out: for tests of what every mode does."""
    try:
        resolve_isolation("auto", None)
    except (IsolationUnavailableError, ValueError):
        return {"isolation": "unsafe_none"}
    return {"isolation": "auto"}


@pytest.fixture
def call_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder for the calls' folders (``tempfile.tempdir``), reachable by uid 65534 (bubblewrap as
    root), so a test can see them appear and go."""
    folder = Path(tempfile.mkdtemp(prefix="verl-test-calls-", dir="/tmp" if os.path.isdir("/tmp") else None))
    folder.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
