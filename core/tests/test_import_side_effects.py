"""``import verl`` is cheap and inert: no plugin, ray, transformers or torch, no env change."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

PROBE = """
import json, os, sys
before = dict(os.environ)
import verl
print(json.dumps({"modules": sorted(sys.modules), "env_before": before, "env_after": dict(os.environ)}))
"""


def _import_verl_in_a_fresh_interpreter() -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_import_verl_loads_no_heavy_module_and_no_plugin():
    modules = set(_import_verl_in_a_fresh_interpreter()["modules"])
    heavy = {"torch", "ray", "transformers", "numpy", "tensordict", "pluggy"}
    assert not {m for m in modules if m.split(".")[0] in heavy}
    plugin_modules = {ep.module for ep in importlib.metadata.entry_points(group="verl.plugins")}
    assert "verl.plugins.builtin" in plugin_modules  # the check below is not vacuous
    assert not {m for m in modules if m.startswith("verl.plugins") or m.startswith("verl.platform")}
    assert not plugin_modules & modules


def test_import_verl_sets_no_environment_variable():
    result = _import_verl_in_a_fresh_interpreter()
    assert result["env_after"] == result["env_before"]
