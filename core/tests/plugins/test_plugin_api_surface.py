"""The plugin API surface (``verl.plugins.surface``) is real, and the in-repo plugins stay inside it."""

from __future__ import annotations

import ast
import pathlib

import pytest

from verl.plugins.surface import PLUGIN_API_SURFACE, allowed, missing_names

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGIN_SOURCES = sorted([*ROOT.glob("plugins/*/src"), *ROOT.glob("examples/*/src")])


def _verl_imports(path: pathlib.Path, source: str | None = None) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for every import of a ``verl`` module in ``path`` (function-local ones too);
    ``source``: the code, when it is not the file's whole text (a block of a Markdown guide)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "verl" or node.module.startswith("verl."):
                out += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name == "verl" or a.name.startswith("verl.")]
    return out


def test_every_listed_name_exists_in_core():
    assert missing_names() == []


def test_allowed_rule():
    assert allowed("verl.plugins.specs", "TrainingEngineSpec")
    assert allowed("verl.testing.conformance.checks", "check_output_layout")  # submodule of a "*" module
    assert not allowed("verl.plugins.manager", "PluginManager")
    assert not allowed("verl.engines.reference.training", "_private_helper")


def test_the_repo_has_plugins_to_check():
    assert any(p.parts[-2] == "verl-fsdp" for p in PLUGIN_SOURCES), PLUGIN_SOURCES


@pytest.mark.parametrize("src", PLUGIN_SOURCES, ids=lambda p: p.parent.name)
def test_in_repo_plugins_import_only_the_api_surface(src: pathlib.Path):
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {module}{'.' + name if name else ''}"
        for path in sorted(src.rglob("*.py"))
        for line, module, name in _verl_imports(path)
        if not allowed(module, name)
    ]
    assert not outside, (
        "these imports use verl-core internals that VERL_PLUGIN_API does not cover; import a listed name "
        "instead, or add the name to verl.plugins.surface.PLUGIN_API_SURFACE (a minor API bump, documented in "
        "docs/plugin-authors.md):\n" + "\n".join(outside)
    )


def test_surface_modules_are_core_modules():
    assert all(m == "verl" or m.startswith("verl.") for m in PLUGIN_API_SURFACE)


GUIDES = [ROOT / "docs" / "plugin-authors.md", ROOT / "docs" / "platform-vendors.md", ROOT / "docs" / "agents.md"]


def _python_blocks(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_the_plugin_guides_examples_import_only_the_api_surface(guide: pathlib.Path):
    """A plugin written from the guides stays inside the promise: every ``verl`` import in their Python examples
    is a listed name (the examples' own packages, ``verl_minmax``, ``verl_npu``, ..., are not ``verl``)."""
    blocks = _python_blocks(guide)
    assert len(blocks) >= 3, f"{guide.name}: no Python examples found"
    outside = [
        f"python block {number}: {module}{'.' + name if name else ''}"
        for number, block in enumerate(blocks, 1)
        for _, module, name in _verl_imports(guide, block)
        if not allowed(module, name)
    ]
    assert not outside, f"{guide.name} examples import verl internals:\n" + "\n".join(outside)


def test_2_1_added_the_builders_third_party_engines_wrap():
    for module, name in [
        ("verl.engines.reference.builders", "build_reference_training_engine"),
        ("verl.engines.reference.builders", "build_hf_rollout_engine"),
        ("verl.engines.reference.builders", "ReferenceEngineOptions"),
        ("verl.engines.reference.builders", "HFRolloutOptions"),
        ("verl.engines.reference.export", "merge_reference_checkpoint"),
    ]:
        assert allowed(module, name), f"{module}.{name}"
    # Still internal: the private helper next to them.
    assert not allowed("verl.engines.reference.builders", "_checked_options")
