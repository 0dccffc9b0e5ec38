"""In an environment where the REAL torch-npu wheel is installed (and no CANN: this machine), the probe runs all
four steps without importing torch_npu (or torch) in its own process. Runs only where torch-npu is installed;
build such a venv as the README says (a torch-npu venv must never be a shared one)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is None,
    reason="torch-npu is not installed here; run in a torch-npu venv (plugins/verl-npu/README.md, Tests)",
)

# The driver: a fresh interpreter, autoload left ON (the default a user has), fixture CANN home and device nodes so
# the probe gets to the child step, which imports the real torch_npu and fails there without CANN's libraries.
DRIVER = """
import json, os, sys
from verl_npu.probe import ProbeRoots, run_probe
root = sys.argv[1]
home = os.path.join(root, "latest")
os.makedirs(os.path.join(home, "x86_64-linux"))
with open(os.path.join(home, "x86_64-linux", "ascend_toolkit_install.info"), "w") as f:
    f.write("version=8.3.RC1\\n")
os.makedirs(os.path.join(root, "dev"))
open(os.path.join(root, "dev", "davinci0"), "w").close()  # a plain file standing in for the device node
roots = ProbeRoots(dev_dir=os.path.join(root, "dev"), ascend_home=home, arch="x86_64", python=sys.executable)
report = run_probe(roots)
print(json.dumps({
    "steps": [[s.name, s.ok, s.reason] for s in report.steps],
    "torch_npu_imported": "torch_npu" in sys.modules,
    "torch_imported": "torch" in sys.modules,
}))
"""


def test_probe_never_imports_torch_npu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300, check=True
    )
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["torch_npu_imported"] is False and got["torch_imported"] is False
    names = [s[0] for s in got["steps"]]
    assert names == ["package", "cann", "devices", "import"], got["steps"]
    assert [s[1] for s in got["steps"]] == [True, True, True, False]
    reason = got["steps"][-1][2]
    # The real wheel's native extension needs CANN's libraries (libhccl.so, libascendcl.so, ...).
    assert reason.startswith("import torch_npu failed in a child process: ImportError: lib"), reason
    assert "cannot open shared object file" in reason and "set_env.sh" in reason
