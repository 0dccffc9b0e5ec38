"""verl-npu loads through its entry point: ``verl plugins`` lists platform ``npu`` (usable: no, with the probe's
reason, on this machine), the plugin manager builds NPUPlatform, and the entry module imports neither torch nor
torch_npu. Needs the distribution installed (``pip install -e plugins/verl-npu``)."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EPS = [ep for ep in metadata.entry_points(group="verl.plugins") if ep.name == "npu"]
pytestmark = pytest.mark.skipif(
    not EPS, reason="verl-npu is not installed (pip install -e plugins/verl-npu): its entry point is what is tested"
)


def test_entry_point_names_the_plugin_module():
    (ep,) = EPS
    assert ep.value == "verl_npu.plugin"
    assert ep.dist is not None and ep.dist.name.replace("_", "-") == "verl-npu"


def test_verl_plugins_lists_npu_with_the_probe_reason():
    from verl_npu.probe import probe_npu

    from verl.plugins import PLUGIN_API_VERSION

    verl = Path(sys.executable).with_name("verl")
    cmd = (
        [str(verl)]
        if verl.exists()
        else [sys.executable, "-c", "import sys; from verl.cli.main import main; sys.exit(main())"]
    )
    out = subprocess.run([*cmd, "plugins"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    api = r"\.".join(map(str, PLUGIN_API_VERSION))  # the plugin declares the API core serves
    assert re.search(rf"^npu\s+verl-npu\s+0\.1\.0\s+verl_npu\.plugin\s+{api}\s+platform: npu$", out.stdout, re.M), (
        out.stdout
    )
    answer = probe_npu()
    row = next(line for line in out.stdout.splitlines() if re.match(r"^\s+npu\s+npu\s+verl-npu\s", line))
    usable = "yes" if answer.available else "no"
    assert re.match(rf"^\s+npu\s+npu\s+verl-npu\s+{usable}\s+", row), row
    assert row.rstrip().endswith(answer.reason), (row, answer.reason)


def test_plugin_manager_builds_the_npu_platform():
    from verl_npu.platform import NPUPlatform
    from verl_npu.probe import probe_npu

    from verl.plugins import PlatformUnavailableError, get_plugin_manager

    try:  # platform selection moves from verl.platform to verl.plugins (issue 16, architecture)
        from verl.plugins import resolve_platform
    except ImportError:
        from verl.platform import resolve_platform

    spec = get_plugin_manager().get("platform", "npu")
    assert type(spec.factory()) is NPUPlatform
    answer = probe_npu()
    if answer.available:
        assert type(resolve_platform("npu")) is NPUPlatform
        return
    with pytest.raises(PlatformUnavailableError) as info:
        resolve_platform("npu")
    assert str(info.value).startswith(f"device 'npu' requested but not available: {answer.reason}")
    assert resolve_platform(None).name != "npu"  # a "no" never wins the automatic choice


def test_entry_module_imports_neither_torch_nor_torch_npu():
    code = (
        "import json, sys, verl_npu.plugin as p; specs = p.verl_platforms(); "
        "print(json.dumps([[s.name for s in specs], 'torch' in sys.modules, 'torch_npu' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [["npu"], False, False]
