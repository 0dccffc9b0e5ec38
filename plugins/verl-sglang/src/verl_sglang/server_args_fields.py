"""The field names of SGLang's ``ServerArgs``, read from the installed source without importing SGLang.

verl passes ``engine_kwargs.sglang`` straight into ``ServerArgs(**kwargs)``, so the options class of this
plugin has one field per ``ServerArgs`` field (:mod:`verl_sglang.options`). Importing
``sglang.srt.server_args`` to list them would pull in torch and half of SGLang at config load, so the names
are read with :mod:`ast` from the files of the installed package:

* sglang <= 0.5.1x (e.g. 0.5.8, verl's pin): ``@dataclasses.dataclass class ServerArgs`` with annotated fields
  in its body (``dataclasses.fields``);
* sglang 0.5.2x (e.g. 0.5.23): ``class ServerArgs`` is rebuilt with ``msgspec.defstruct`` from the namespaces
  listed in ``_INPUT_NAMESPACES`` (``sglang/srt/arg_groups/fields/*.py``, one ``msgspec.Struct`` each) plus its
  own annotations (``__struct_fields__``). verl's ``dataclasses.fields(ServerArgs)`` raises TypeError there.

Where sglang is not installed, the names of 0.5.23 come from :mod:`verl_sglang._server_args_snapshot` (generated
by ``scripts/snapshot_server_args.py``; a test compares it with the installed source and the live class).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import attrs

SERVER_ARGS_FILE = ("srt", "server_args.py")


@attrs.frozen
class ServerArgsFields:
    """The ``ServerArgs`` field names in use and where they came from.

    Attributes:
        names: field names, in declaration order.
        source: ``"installed sglang <version> (<path>)"`` or ``"snapshot of sglang <version>"``, plus why the
            installed source could not be read when that happened.
        version: the sglang version the names belong to (None when unknown).
    """

    names: tuple[str, ...]
    source: str
    version: str | None


def sglang_package_dir() -> Path | None:
    """The installed ``sglang`` package folder (``find_spec`` of a top-level name imports nothing), or None."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _is_classvar(annotation: ast.expr) -> bool:
    node = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    if isinstance(node, ast.Attribute):
        return node.attr == "ClassVar"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "ClassVar[int]" under future annotations
        return node.value.startswith(("ClassVar", "typing.ClassVar"))
    return isinstance(node, ast.Name) and node.id == "ClassVar"


def _annotated_names(cls: ast.ClassDef) -> list[str]:
    """Names annotated in a class body (dataclass / msgspec fields), ``ClassVar`` excluded."""
    return [
        stmt.target.id
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and not _is_classvar(stmt.annotation)
    ]


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _module_file(package_dir: Path, module: str) -> Path:
    parts = module.split(".")
    if parts[0] != "sglang":
        raise ValueError(f"namespace module {module!r} is outside the sglang package")
    return package_dir.joinpath(*parts[1:]).with_suffix(".py")


def _list_of_names(tree: ast.Module, variable: str) -> list[str] | None:
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == variable for t in targets) and isinstance(
            node.value, (ast.List, ast.Tuple)
        ):
            return [elt.id for elt in node.value.elts if isinstance(elt, ast.Name)]
    return None


def _imported_from(tree: ast.Module) -> dict[str, str]:
    """``{local name: module}`` of the module-level ``from X import Y`` statements."""
    return {
        (alias.asname or alias.name): node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def read_server_args_fields(package_dir: Path) -> tuple[str, ...]:
    """``ServerArgs`` field names of the sglang package at ``package_dir``, in declaration order.

    Args:
        package_dir: the ``sglang`` package folder (holding ``srt/server_args.py``).

    Raises:
        FileNotFoundError: a source file is missing.
        ValueError: the layout is neither of the two above (no ``ServerArgs`` class, a namespace that cannot
            be found, or no field at all), naming what was missing.
    """
    path = package_dir.joinpath(*SERVER_ARGS_FILE)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    server_args = _class(tree, "ServerArgs")
    if server_args is None:
        raise ValueError(f"{path}: no 'class ServerArgs'")
    names: list[str] = []
    namespaces = _list_of_names(tree, "_INPUT_NAMESPACES")
    if namespaces is not None:
        imports = _imported_from(tree)
        for namespace in namespaces:
            if namespace not in imports:
                raise ValueError(f"{path}: namespace {namespace!r} of _INPUT_NAMESPACES is not imported by name")
            ns_path = _module_file(package_dir, imports[namespace])
            ns_tree = ast.parse(ns_path.read_text(encoding="utf-8"), filename=str(ns_path))
            ns_class = _class(ns_tree, namespace)
            if ns_class is None:
                raise ValueError(f"{ns_path}: no 'class {namespace}'")
            names += _annotated_names(ns_class)
    # ServerArgs' own annotations come after the namespaces' ({**namespace fields, **ServerArgs.__annotations__}).
    names += [n for n in _annotated_names(server_args) if n not in names]
    if not names:
        raise ValueError(f"{path}: ServerArgs declares no field (neither in its body nor through _INPUT_NAMESPACES)")
    return tuple(dict.fromkeys(names))


@functools.cache
def server_args_fields() -> ServerArgsFields:
    """The field names this machine's ``ServerArgs`` takes: the installed source when sglang is installed and
    readable, else the bundled 0.5.23 snapshot (cached for the process)."""
    from verl_sglang import _server_args_snapshot as snapshot
    from verl_sglang.backend import sglang_version

    package_dir = sglang_package_dir()
    reason = ""
    if package_dir is not None:
        version = sglang_version()
        try:
            return ServerArgsFields(
                read_server_args_fields(package_dir), f"installed sglang {version} ({package_dir})", version
            )
        except (OSError, SyntaxError, ValueError) as exc:
            reason = f"; the installed sglang {version} at {package_dir} could not be read: {exc}"
    return ServerArgsFields(
        snapshot.FIELDS, f"snapshot of sglang {snapshot.SGLANG_VERSION}{reason}", snapshot.SGLANG_VERSION
    )
