"""Fixtures of the vendor tests: the environment in which ``examples/pretend-accelerator`` is installed.

Where ``verl-pretend-accelerator`` is pip-installed (``nox -s "example(pretend)"``) subprocesses get the
environment as it is. Elsewhere (``nox -s core``, a dev venv) a **stand-in install** is written: a
``verl_pretend_accelerator-<version>.dist-info`` folder whose ``METADATA`` and ``entry_points.txt`` come from the
example's own ``pyproject.toml``, on ``PYTHONPATH`` together with the example's ``src``. ``importlib.metadata``
finds it exactly as it finds an editable install, so verl's process-wide plugin manager discovers the plugin
through its real entry point either way; only pip's copying of the files is skipped.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pretend-accelerator"
DIST = "verl-pretend-accelerator"


def _read_pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]


def _installed() -> bool:
    try:
        importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="session")
def pretend_site(tmp_path_factory) -> list[str]:
    """``PYTHONPATH`` entries that make the example plugin installed: ``[]`` when pip installed it, else the
    stand-in dist-info folder and the example's ``src`` (see the module docstring)."""
    if _installed():
        return []
    project = _read_pyproject()
    site = tmp_path_factory.mktemp("pretend-site")
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in project["entry-points"]["verl.plugins"].items())
    (info / "entry_points.txt").write_text(f"[verl.plugins]\n{lines}")
    return [str(site), str(EXAMPLE / "src")]


@pytest.fixture
def pretend_env(pretend_site):
    """Factory of a subprocess environment with the plugin installed and ``VERL_PRETEND_DEVICES`` set or unset.

    ``pretend_env(devices=2)`` -> ``dict`` for ``subprocess.run(env=...)``; ``devices=None`` removes the variable.
    """

    def make(devices: int | None = 2, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("VERL_PRETEND_DEVICES", "PRETEND_VISIBLE_DEVICES")}
        env.pop("VERL_PLUGINS", None)
        env["PYTHONPATH"] = os.pathsep.join([*pretend_site, *filter(None, [env.get("PYTHONPATH")])])
        env.setdefault("OMP_NUM_THREADS", "1")
        if devices is not None:
            env["VERL_PRETEND_DEVICES"] = str(devices)
        env.update(extra)
        return env

    return make
