"""``verl plugins``: text and JSON reports, with fake installed distributions."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from verl.cli.main import main
from verl.plugins import reset_plugin_manager

ENGINES = """
from verl.plugins import hookimpl
from verl.plugins.specs import RolloutEngineSpec, TrainingEngineSpec

VERL_PLUGIN_API = (2, 0)

def _make(*args, **kwargs):
    raise AssertionError("verl plugins must not build engines")

@hookimpl
def verl_rollout_engines():
    return [RolloutEngineSpec(name="gpu_only", factory=_make, devices=("cuda",))]

@hookimpl
def verl_training_engines():
    return [TrainingEngineSpec(name="anywhere", factory=_make, devices=("cpu", "cuda"), capabilities={"lora"})]
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    """Install fake distributions: ``site(dist, version, ep_name, module, source)``."""
    monkeypatch.delenv("VERL_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_plugin_manager()
    modules = []

    def install(dist, version, ep_name, module, source):
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[verl.plugins]\n{ep_name} = {module}\n")
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        modules.append(module)

    yield install
    reset_plugin_manager()
    for module in modules:
        sys.modules.pop(module, None)


def _run(capsys, *argv):
    rc = main(["plugins", *argv])
    return rc, capsys.readouterr().out


def test_text_report_lists_plugins_specs_and_usability(site, capsys):
    site("verl-engines", "2.1", "engines", "cli_engines_plugin", ENGINES)
    rc, out = _run(capsys)
    assert rc == 0
    assert "verl plugins: entry-point group 'verl.plugins', plugin API 2.6, VERL_PLUGINS unset (all plugins)" in out
    lines = out.splitlines()
    builtin_row = next(line for line in lines if line.startswith("builtin "))
    assert builtin_row.split()[:5] == ["builtin", "verl-core", "0.1.0", "verl.plugins.builtin", "2.6"]
    assert "platform: cpu, cuda" in builtin_row
    engines_row = next(line for line in lines if line.startswith("engines "))
    assert engines_row.split()[:5] == ["engines", "verl-engines", "2.1", "cli_engines_plugin", "2.0"]
    assert "training_engine: anywhere; rollout_engine: gpu_only" in engines_row
    cpu_row = next(line for line in lines if line.strip().startswith("cpu "))
    assert cpu_row.split()[:4] == ["cpu", "builtin", "verl-core", "yes"]
    anywhere = next(line for line in lines if line.strip().startswith("anywhere "))
    assert anywhere.split()[:4] == ["anywhere", "engines", "verl-engines", "yes"]
    if not torch.cuda.is_available():
        assert "Platform of this machine (automatic choice): cpu" in out
        gpu_only = next(line for line in lines if line.strip().startswith("gpu_only "))
        assert gpu_only.split()[:4] == ["gpu_only", "engines", "verl-engines", "no"]
        assert gpu_only.endswith("needs cuda; this machine resolves to cpu")
    assert "Failed plugins" not in out


def test_failed_plugins_are_shown_and_set_the_exit_status(site, capsys):
    site("verl-vllm", "0.4.0", "vllm", "cli_broken_plugin", "import verl_cli_missing_backend_xyz\n")
    rc, out = _run(capsys)
    assert rc == 1
    assert "Failed plugins:" in out
    assert (
        "  - vllm (verl-vllm 0.4.0, module cli_broken_plugin) [import]: "
        "ModuleNotFoundError: No module named 'verl_cli_missing_backend_xyz'"
    ) in out


def test_json_report(site, capsys):
    site("verl-engines", "2.1", "engines", "cli_engines_json_plugin", ENGINES)
    site("verl-old", "0.1", "old", "cli_old_plugin", "VERL_PLUGIN_API = (0, 1)\n")
    rc, out = _run(capsys, "--json")
    assert rc == 1
    report = json.loads(out)
    assert report["api_version"] == [2, 6] and report["allow_list"] is None
    by_name = {p["name"]: p for p in report["plugins"]}
    assert by_name["builtin"]["distribution"] == "verl-core"
    assert by_name["builtin"]["provides"]["platform"] == ["cpu", "cuda", "rocm"]
    assert by_name["engines"] == {
        "name": "engines",
        "distribution": "verl-engines",
        "version": "2.1",
        "module": "cli_engines_json_plugin",
        "api_version": [2, 0],
        "provides": {"training_engine": ["anywhere"], "rollout_engine": ["gpu_only"]},
    }
    (training,) = [row for row in report["specs"]["training_engine"] if row["plugin"] == "engines"]
    assert training["devices"] == ["cpu", "cuda"] and training["capabilities"] == ["lora"]
    assert training["usable"] is True
    cpu = next(row for row in report["specs"]["platform"] if row["name"] == "cpu")
    assert (cpu["usable"], cpu["accelerator"]) == (True, False)
    (failure,) = report["failures"]
    assert (failure["name"], failure["distribution"], failure["version"], failure["stage"]) == (
        "old",
        "verl-old",
        "0.1",
        "api_version",
    )
    assert "built for verl plugin API 0.1" in failure["error"]
    assert report["conflicts"] == [] and report["disabled"] == []


def test_disabled_and_conflicting_plugins(site, capsys, monkeypatch):
    site("verl-engines", "2.1", "engines", "cli_engines_a_plugin", ENGINES)
    site("engines-fork", "0.9", "fork", "cli_engines_b_plugin", ENGINES)
    site("verl-extra", "1.0", "extra", "cli_extra_plugin", ENGINES)
    monkeypatch.setenv("VERL_PLUGINS", "engines,engines-fork")
    rc, out = _run(capsys)
    assert rc == 1
    assert "Not loaded (VERL_PLUGINS='engines,engines-fork' does not list them):\n  - extra (verl-extra 1.0)" in out
    assert "Conflicts (these names cannot be used until all but one provider is removed):" in out
    # plugins load sorted by distribution name, so engines-fork comes first
    assert "  - training_engine 'anywhere': fork (engines-fork); engines (verl-engines)" in out
    assert "  - rollout_engine 'gpu_only': fork (engines-fork); engines (verl-engines)" in out


MISSING_DEPENDENCY = """
from verl.plugins import hookimpl
from verl.plugins.specs import RolloutEngineSpec

VERL_PLUGIN_API = (2, 0)

def _make(*args, **kwargs):
    raise AssertionError("verl plugins must not build engines")

def _needs_fastgen():
    return "fastgen is not installed: pip install 'verl-fastgen[cpu]'"

@hookimpl
def verl_rollout_engines():
    return [RolloutEngineSpec(name="fastgen", factory=_make, devices=("cpu",), available=_needs_fastgen)]
"""


def test_backend_whose_dependency_is_missing_is_listed_unusable_and_refused_by_config(site, capsys):
    site("verl-fastgen", "0.1", "fastgen", "fastgen_plugin", MISSING_DEPENDENCY)
    rc, out = _run(capsys, "--json")
    assert rc == 0
    (row,) = [r for r in json.loads(out)["specs"]["rollout_engine"] if r["name"] == "fastgen"]
    assert row["usable"] is False
    assert row["reason"] == "fastgen is not installed: pip install 'verl-fastgen[cpu]'"
    from verl.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(overrides=["actor_rollout_ref.rollout.name=fastgen"])
    assert (
        "actor_rollout_ref.rollout.name: rollout engine 'fastgen' is installed but cannot run here: "
        "fastgen is not installed: pip install 'verl-fastgen[cpu]'"
    ) in str(err.value)
