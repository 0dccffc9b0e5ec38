"""Which Python the box runs (config ``python``): by default the trainer's base interpreter with the standard
library only; a dedicated interpreter (here a virtual environment made for the test) with its own packages,
read-only; the trainer's own environment named as ``python`` still gives the standard library only."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from verl.tools.code_interpreter import CodeInterpreterTool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the boxes are Linux namespaces")


def run(config: dict, code: str) -> str:
    tool = CodeInterpreterTool({"timeout": 20, **config})
    response, _, _ = asyncio.run(tool.execute("i", {"code": code}))
    return response.text


TRAINER_PACKAGES = "for name in ('attrs', 'pytest', 'verl'):\n    try:\n        __import__(name)\n        print(name, 'visible')\n    except ImportError:\n        print(name, 'hidden')\nimport json, sqlite3, decimal\nprint('stdlib ok')"


def test_the_default_sees_the_standard_library_only(box):
    if "python" in box:
        pytest.skip(f"this machine's {box['isolation']} box needs a dedicated interpreter ({box['python']})")
    assert run(box, TRAINER_PACKAGES) == "attrs hidden\npytest hidden\nverl hidden\nstdlib ok\n"


def test_the_trainers_own_environment_as_python_is_still_standard_library_only(box):
    if "python" in box:
        pytest.skip(f"this machine's {box['isolation']} box needs a dedicated interpreter ({box['python']})")
    tool = CodeInterpreterTool({"timeout": 20, **box, "python": sys.executable})
    assert not tool.isolation.interpreter.packages
    assert run({**box, "python": sys.executable}, TRAINER_PACKAGES).endswith("verl hidden\nstdlib ok\n")


@pytest.fixture
def outside_tmp() -> Path:
    """A folder every user may enter (bubblewrap as root needs it) and not under /tmp (the box's own /tmp)."""
    if not os.path.isdir("/var/tmp"):
        pytest.skip("no /var/tmp for an interpreter outside /tmp")
    folder = Path(tempfile.mkdtemp(prefix="verl-test-venv-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_dedicated_interpreter_brings_its_packages_read_only(box, outside_tmp):
    base = box.get("python") or os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    venv = outside_tmp / "tool-venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "verl_box_pkg.py").write_text("VALUE = 41\n")
    code = (
        "import os, verl_box_pkg\nprint(verl_box_pkg.VALUE + 1)\n"
        "print(os.access(os.path.dirname(verl_box_pkg.__file__), os.W_OK))\n" + TRAINER_PACKAGES
    )
    config = {**box, "python": str(venv / "bin" / "python")}
    assert CodeInterpreterTool({"timeout": 20, **config}).isolation.interpreter.packages
    text = run(config, code)
    assert text.startswith("42\nFalse\nattrs hidden\npytest hidden\nverl hidden\nstdlib ok\n"), text
    assert sysconfig.get_paths()["purelib"] != purelib


def test_an_interpreter_under_tmp_is_refused_by_name(call_root):
    venv = call_root / "tool-venv"  # under /tmp: the box's /tmp would cover it
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    with pytest.raises(ValueError, match=rf"its installation folder {venv} is under /tmp, which the box replaces"):
        CodeInterpreterTool({"timeout": 5, "isolation": "namespaces", "python": str(venv / "bin" / "python")})


def test_a_trainer_path_that_holds_the_system_or_the_interpreter_is_not_hidden(monkeypatch, tmp_path):
    from verl.tools import _box_layout

    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    monkeypatch.syspath_prepend("/usr")  # e.g. PYTHONPATH=/usr: hiding it would empty the box
    monkeypatch.syspath_prepend(os.path.dirname(stdlib))
    hidden = _box_layout.trainer_interpreter().hidden
    assert "/usr" not in hidden
    assert not any(base.startswith(h + "/") or stdlib.startswith(h + "/") or stdlib == h for h in hidden)
