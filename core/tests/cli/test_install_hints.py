"""Install hints name a real way to get a backend, and an unknown backend name gets a "did you mean"."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import tomllib

import verl.plugins.builtin as builtin
from verl.config import ConfigError, load_config
from verl.plugins import PluginManager, UnknownPluginError, hookimpl
from verl.plugins.errors import KNOWN_BACKENDS
from verl.plugins.specs import RolloutEngineSpec

REPO = Path(__file__).resolve().parents[3]
SOURCES = [*sorted((REPO / "core" / "src").rglob("*.py")), *sorted(REPO.glob("plugins/*/src/**/*.py"))]
# `pip install X` where X is a folder of the checkout ('./plugins/verl-vllm[cpu]', ./plugins/verl-fsdp).
LOCAL_INSTALL = re.compile(r"pip install '?\./([\w./-]+?)(?:\[(\w+)\])?'?(?=[\s),;]|$)")


def _bare() -> PluginManager:
    """Core's built-ins only (whatever this environment has installed)."""
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin, dist_name="verl-core")
    return pm


def _unknown(pm: PluginManager, kind: str, name: str) -> str:
    with pytest.raises(UnknownPluginError) as err:
        pm.get(kind, name)
    return str(err.value)


def _extras(folder: Path) -> set[str]:
    return set(tomllib.loads((folder / "pyproject.toml").read_text())["project"].get("optional-dependencies", {}))


@pytest.mark.parametrize("name", sorted(KNOWN_BACKENDS))
def test_every_printed_hint_names_an_existing_folder_or_says_not_available(name: str) -> None:
    hint = KNOWN_BACKENDS[name]
    text = _unknown(_bare(), hint.kind, name)
    folder = REPO / "plugins" / hint.distribution
    if hint.folder is None:
        assert f"{hint.distribution} is not available yet" in text and "pip install" not in text
        assert not folder.exists(), f"{folder} exists now: give KNOWN_BACKENDS[{name!r}] its folder"
        return
    installs = LOCAL_INSTALL.findall(text)
    assert installs, text
    for path, extra in installs:
        assert (REPO / path / "pyproject.toml").is_file(), path
        assert not extra or extra in _extras(REPO / path), (path, extra)
    assert f"plugins/{hint.distribution}" in {p for p, _ in installs}


def test_no_source_tells_to_pip_install_an_unpublished_verl_distribution() -> None:
    # verl-core and its plugins are on no package index: `pip install verl-fsdp` / 'verl-core[ray]' cannot work.
    bad = re.compile(r"pip install (?:--[\w-]+ )*['\"]?verl-")
    found = [
        f"{source.relative_to(REPO)}:{number}: {line.strip()}"
        for source in SOURCES
        for number, line in enumerate(source.read_text().splitlines(), 1)
        if bad.search(line)
    ]
    assert found == []
    # ... and every checkout folder a source tells to install exists, with the extra it names.
    for source in SOURCES:
        for path, extra in LOCAL_INSTALL.findall(source.read_text()):
            if "{" not in path:
                assert (REPO / path / "pyproject.toml").is_file(), (source, path)
                assert not extra or extra in _extras(REPO / path), (source, path, extra)


@pytest.mark.parametrize(
    "kind,typo,meant",
    [("rollout_engine", "vlm", "vllm"), ("training_engine", "fsdb", "fsdp"), ("platform", "npuu", "npu")],
)
def test_did_you_mean_covers_known_backends_that_are_not_installed(kind: str, typo: str, meant: str) -> None:
    text = _unknown(_bare(), kind, typo)
    assert f"Did you mean {meant!r}? (not installed, see below)" in text
    assert f"{meant!r} is provided by the {KNOWN_BACKENDS[meant].distribution} plugin" in text


def test_did_you_mean_an_installed_name_has_no_install_hint() -> None:
    pm = _bare()
    text = _unknown(pm, "rollout_engine", "hff")
    assert "Did you mean 'hf'?" in text and "not installed" not in text and "pip install" not in text

    # A verl-vllm that is installed: "vlm" suggests its "vllm", with no hint to install it.
    @hookimpl
    def verl_rollout_engines() -> list[RolloutEngineSpec]:
        return [RolloutEngineSpec(name="vllm", factory=lambda **_: None)]

    module = types.ModuleType("fake_vllm_plugin")
    module.verl_rollout_engines = verl_rollout_engines
    pm.register(module, dist_name="verl-vllm")
    text = _unknown(pm, "rollout_engine", "vlm")
    assert "Did you mean 'vllm'?" in text and "not installed" not in text and "pip install" not in text


def test_the_config_error_for_an_unknown_backend_says_did_you_mean() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["actor_rollout_ref.rollout.name=vlm"], plugin_manager=_bare())
    (issue,) = [i for i in err.value.issues if i.key == "actor_rollout_ref.rollout.name"]
    assert "unknown rollout engine 'vlm'" in issue.message and "Did you mean 'vllm'?" in issue.message
    assert "pip install './plugins/verl-vllm[cpu]'" in issue.message
