"""The lower layers never import the higher ones: an import-graph check over the source (``ast``), every
``import``/``from`` statement counted, function-local and ``TYPE_CHECKING`` ones included.

Rule: ``verl.protocol``, ``verl.algorithms``, ``verl.platform`` and ``verl.engines`` (the layers the plugins,
config, workers, trainer and CLI are built on) import none of ``verl.plugins``, ``verl.config``,
``verl.workers``, ``verl.trainer``, ``verl.cli``. Selection (which platform, which plugin-provided function)
is done above and passed down. What still breaks the rule is listed in :data:`ALLOWED`, each with its reason;
an entry that no longer matches anything fails the test, so the list only shrinks."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LOWER = ("verl.protocol", "verl.algorithms", "verl.platform", "verl.engines")
HIGHER = ("verl.plugins", "verl.config", "verl.workers", "verl.trainer", "verl.cli")

#: (importing module, imported module prefix) -> why it is still allowed.
ALLOWED: dict[tuple[str, str], str] = {
    # Empty: the weight-sync engines no longer structure their engine_kwargs (config load validates the options
    # once and the factory receives them, issue #16) and the broadcast factory reads the resolved placement key.
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved; ``from verl import x`` as
    ``verl.x``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from verl import config`
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _edges() -> list[tuple[str, str, str]]:
    """``(importer, imported, the forbidden prefix it falls under)`` for every upward import of a lower layer."""
    out = []
    for path in sorted(SRC.joinpath("verl").rglob("*.py")):
        module = _module_name(path)
        if not any(_within(module, low) for low in LOWER):
            continue
        for name in sorted(_imports(path, module)):
            for high in HIGHER:
                if _within(name, high):
                    out.append((module, name, high))
    return out


def test_the_scanner_sees_function_local_relative_and_from_package_imports(tmp_path):
    """The parser on a stand-in module: all three forms count."""
    pkg = tmp_path / "verl" / "engines"
    pkg.mkdir(parents=True)
    source = pkg / "thing.py"
    source.write_text(
        "def f():\n    from verl.plugins import get_plugin_manager\n"
        "from ..config import schema\nfrom verl import trainer\nimport verl.cli.main\n"
    )
    names = _imports(source, "verl.engines.thing")
    assert {"verl.plugins", "verl.config", "verl.config.schema", "verl.trainer", "verl.cli.main"} <= names


def test_lower_layers_do_not_import_higher_ones():
    edges = _edges()
    unexplained = sorted({f"{src} imports {dst}" for src, dst, high in edges if (src, high) not in ALLOWED})
    assert unexplained == [], "lower layers call up; pass the selected object down instead:\n" + "\n".join(unexplained)


def test_every_allowed_exception_is_still_needed():
    used = {(src, high) for src, _, high in _edges()}
    assert sorted(set(ALLOWED) - used) == [], "drop these from ALLOWED: the import is gone"
