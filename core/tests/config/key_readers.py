"""Which config keys the source tree reads: a small static analysis over ``ast`` (used by test_no_inert_keys).

An attribute chain (``cfg.actor_rollout_ref.rollout.top_k``) or a literal key read (``getattr(x, "k")``,
``x.get("k")``, ``x["k"]``, ``cfg_get(x, "k", default)``) is resolved to the chains of schema section names it
may stand for, through

* local aliases (``arr = cfg.actor_rollout_ref``; ``actor, ref = arr.actor, arr.ref``),
* ``self.<name> = ...`` anywhere in the same class,
* parameters: an annotation naming a schema class (``rollout: RolloutConfig``), and every call site of a
  function or class of that name in the tree (``build_hf_rollout(config.actor_rollout_ref.rollout, ...)``
  binds the callee's first parameter to that section),
* a name spelled like a section (``rollout``, ``critic_cfg``) when nothing else resolves it.

A chain reads the leaf keys that match it on the longest suffix; when those keys belong to different schema
classes (``model.use_remove_padding``: actor ``ModelConfig`` or ``CriticModelConfig``?) it reads none of them,
so a reader must make clear which section it reads. The analysis is flow-insensitive and name-based (a call
binds every function of that name), so it can only over-approximate who reads what across unrelated
functions of one name; it never invents a read of a key whose leaf name does not appear in the chain.
"""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

import verl.config.schema as schema_mod
from verl.config.keys import schema_paths, section_class
from verl.config.schema import RootConfig

Chain = tuple[str, ...]

# ``f(section, "key", default)`` helpers in the tree that read a key of an attrs section or a mapping.
GETTERS = {"getattr", "cfg_get", "_get", "_cfg", "_pl", "_lookup"}
_CFG_SUFFIXES = ("_config", "_cfg", "_conf", "_options", "_opts", "cfg", "config")
_MAX_DEPTH = 40


def _field_type(cls: type, name: str) -> typing.Any:
    return typing.get_type_hints(cls)[name]


def owners() -> dict[str, tuple[type, str]]:
    """Every dotted schema path -> (the attrs class that defines it, attribute name)."""
    out: dict[str, tuple[type, str]] = {}

    def walk(cls: type, prefix: str) -> None:
        for field in attrs.fields(cls):
            path = f"{prefix}.{field.name}" if prefix else field.name
            out[path] = (cls, field.name)
            sub = section_class(_field_type(cls, field.name))
            if sub is not None:
                walk(sub, path)

    walk(RootConfig, "")
    return out


OWNERS = owners()
LEAVES: tuple[str, ...] = tuple(p for p in schema_paths() if section_class(_field_type(*OWNERS[p])) is None)
SECTION_NAMES = {p.rsplit(".", 1)[-1] for p in schema_paths() if p not in LEAVES}
_SCHEMA_CLASSES = {n: getattr(schema_mod, n) for n in schema_mod.__all__ if attrs.has(getattr(schema_mod, n))}
# An annotation naming a schema class stands for every path where that class sits.
CLASS_PATHS: dict[str, list[Chain]] = {
    name: [
        tuple(p.split(".")) for p in schema_paths() if p not in LEAVES and section_class(_field_type(*OWNERS[p])) is cls
    ]
    for name, cls in _SCHEMA_CLASSES.items()
}
CLASS_PATHS["RootConfig"] = [()]


def _hint(name: str) -> Chain | None:
    """The section a variable's spelling names (``rollout_cfg`` -> ``rollout``), if any."""
    if name in SECTION_NAMES:
        return (name,)
    for suffix in _CFG_SUFFIXES:
        stem = name.removesuffix(suffix).rstrip("_")
        if stem != name and stem in SECTION_NAMES:
            return (stem,)
    return None


def _annotation_chains(node: ast.expr | None) -> list[Chain]:
    """Paths of the schema class an annotation names (``RolloutConfig``, ``"RolloutConfig | None"``)."""
    if node is None:
        return []
    text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ast.unparse(node)
    names = [part.strip().rsplit(".", 1)[-1] for part in text.split("|")]
    return [chain for name in names for chain in CLASS_PATHS.get(name, [])]


class Scope:
    """Names bound in one function, class or module body (flow-insensitive)."""

    def __init__(self, parent: Scope | None, cls_attrs: dict[str, list[tuple[ast.expr, Scope]]]) -> None:
        self.parent = parent
        self.bound: dict[str, list[tuple[ast.expr, Scope]]] = {}
        self.annotated: dict[str, list[Chain]] = {}
        self.cls_attrs = cls_attrs  # self.<name> = expr anywhere in the enclosing class

    def lookup(self, name: str) -> Scope | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.bound or name in scope.annotated:
                return scope
            scope = scope.parent
        return None


@attrs.define
class Func:
    """A function or method of the tree, with its scope (for binding call-site arguments)."""

    scope: Scope
    positional: list[str]
    keyword: set[str]
    is_method: bool


def _literal_key(expr: ast.AST) -> tuple[ast.expr, str] | None:
    """``getattr(x, "k")``, ``cfg_get(x, "k")``, ``x.get("k")`` and ``x["k"]`` as ``(x, "k")``."""
    if isinstance(expr, ast.Call) and expr.args:
        func = expr.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in GETTERS and len(expr.args) >= 2:
            key = expr.args[1]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return expr.args[0], key.value
        if isinstance(func, ast.Attribute) and name == "get":
            key = expr.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return func.value, key.value
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
        return expr.value, expr.slice.value
    return None


class Analysis:
    """Reads of config keys in a set of modules (see the module docstring)."""

    def __init__(self, sources: Iterable[tuple[str, str]]) -> None:
        self.funcs: dict[str, list[Func]] = {}
        self.reads: list[tuple[ast.expr, Scope, str]] = []  # (read expression, its scope, file)
        self.calls: list[tuple[ast.Call, Scope]] = []
        self._memo: dict[tuple[int, int], set[Chain]] = {}
        for name, text in sources:
            self._module(ast.parse(text, filename=name), name)
        for call, scope in self.calls:
            self._bind_call(call, scope)

    # -- pass 1: scopes, functions, reads and calls

    def _module(self, tree: ast.Module, name: str) -> None:
        top = Scope(None, {})
        self._fill(top, tree.body)
        self._visit_body(tree, top, name, None)

    def _visit_body(self, node: ast.AST, scope: Scope, file: str, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            self._visit(child, scope, file, cls)

    def _visit(self, node: ast.AST, scope: Scope, file: str, cls: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            inner = Scope(scope, {})
            self._fill(inner, node.body)
            self._visit_body(node, inner, file, node.name)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner = Scope(scope, scope.cls_attrs)
            args = node.args
            positional = [a.arg for a in [*args.posonlyargs, *args.args]]
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                chains = _annotation_chains(arg.annotation)
                if chains:
                    inner.annotated[arg.arg] = chains
            is_method = cls is not None and bool(positional) and positional[0] in ("self", "cls")
            func = Func(inner, positional, {a.arg for a in args.kwonlyargs} | set(positional), is_method)
            self.funcs.setdefault(node.name, []).append(func)
            if node.name == "__init__" and cls is not None:
                self.funcs.setdefault(cls, []).append(func)
            self._fill(inner, node.body)
            self._visit_body(node, inner, file, None)
            return
        if isinstance(node, ast.Call):
            self.calls.append((node, scope))
        is_store = isinstance(getattr(node, "ctx", None), ast.Store | ast.Del)  # ``d["k"] = v`` reads nothing
        if not is_store and (isinstance(node, ast.Attribute) or _literal_key(node) is not None):
            self.reads.append((node, scope, file))  # type: ignore[arg-type]
        self._visit_body(node, scope, file, cls)

    def _fill(self, scope: Scope, body: list[ast.stmt]) -> None:
        """Bind the assignments of ``body``, not descending into nested functions or classes."""
        stack: list[ast.AST] = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(scope, target, node.value)
            elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                self._bind(scope, node.target, node.value)
            stack.extend(ast.iter_child_nodes(node))

    def _bind(self, scope: Scope, target: ast.expr, value: ast.expr | None) -> None:
        if value is None:
            return
        if isinstance(target, ast.Name):
            scope.bound.setdefault(target.id, []).append((value, scope))
        elif isinstance(target, ast.Tuple | ast.List):
            values = value.elts if isinstance(value, ast.Tuple | ast.List) else []
            for i, elt in enumerate(target.elts):
                self._bind(scope, elt, values[i] if i < len(values) else None)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            scope.cls_attrs.setdefault(target.attr, []).append((value, scope))

    # -- pass 2: call sites bind the parameters of every function of that name

    def _bind_call(self, call: ast.Call, scope: Scope) -> None:
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        for target in self.funcs.get(name or "", []):
            params = target.positional[1:] if target.is_method else target.positional
            for param, arg in zip(params, call.args, strict=False):
                if isinstance(arg, ast.Starred):
                    break
                target.scope.bound.setdefault(param, []).append((arg, scope))
            for kw in call.keywords:
                if kw.arg is not None and kw.arg in target.keyword:
                    target.scope.bound.setdefault(kw.arg, []).append((kw.value, scope))

    # -- pass 3: resolution

    def resolve(self, expr: ast.expr, scope: Scope, depth: int = 0, seen: frozenset[int] = frozenset()) -> set[Chain]:
        """Every chain of section names ``expr`` may stand for (``()`` = an unknown base)."""
        if depth > _MAX_DEPTH or id(expr) in seen:
            return {()}
        # Memoised per (expression, scope): a name bound at many call sites that pass names bound at many call
        # sites is exponential without it (the agent-loop code made this test run for over an hour). A result
        # cut short by a cycle may miss chains; that can only report a key as unread, never hide one.
        memo_key = (id(expr), id(scope))
        if memo_key in self._memo:
            return self._memo[memo_key]
        result = self._resolve(expr, scope, depth, seen | {id(expr)})
        self._memo[memo_key] = result
        return result

    def _resolve(self, expr: ast.expr, scope: Scope, depth: int, seen: frozenset[int]) -> set[Chain]:
        if isinstance(expr, ast.Attribute):
            base = expr.value
            if isinstance(base, ast.Name) and base.id == "self":
                found = set()
                for value, where in scope.cls_attrs.get(expr.attr, []):
                    found |= self.resolve(value, where, depth + 1, seen)
                found.discard(())
                return found or {_hint(expr.attr) or ()}
            return {chain + (expr.attr,) for chain in self.resolve(base, scope, depth + 1, seen)}
        if isinstance(expr, ast.Name):
            where = scope.lookup(expr.id)
            found: set[Chain] = set()
            if where is not None:
                found |= set(where.annotated.get(expr.id, []))
                for value, at in where.bound.get(expr.id, []):
                    found |= self.resolve(value, at, depth + 1, seen)
            found.discard(())
            return found or {_hint(expr.id) or ()}
        literal = _literal_key(expr)
        if literal is not None:
            base, key = literal
            return {chain + (key,) for chain in self.resolve(base, scope, depth + 1, seen)}
        if isinstance(expr, ast.BoolOp):  # ``a.x or b.x``
            return set().union(*(self.resolve(v, scope, depth + 1, seen) for v in expr.values))
        if isinstance(expr, ast.IfExp):
            return self.resolve(expr.body, scope, depth + 1, seen) | self.resolve(expr.orelse, scope, depth + 1, seen)
        return {()}

    def read_keys(self) -> dict[str, set[str]]:
        """Leaf key -> the files that read it."""
        out: dict[str, set[str]] = {}
        for expr, scope, file in self.reads:
            for chain in self.resolve(expr, scope):
                for key in keys_read_by(chain):
                    out.setdefault(key, set()).add(file)
        return out


def keys_read_by(chain: Chain) -> set[str]:
    """The leaf keys one chain reads: those matching it on the longest suffix, unless their classes differ."""
    best, hits = 0, []
    for path in LEAVES:
        parts = path.split(".")
        k = 0
        while k < min(len(parts), len(chain)) and parts[-1 - k] == chain[-1 - k]:
            k += 1
        if k == 0 or k < best:
            continue
        if k > best:
            best, hits = k, []
        hits.append(path)
    if not hits or len({OWNERS[p] for p in hits}) > 1:
        return set()
    return set(hits)


def tree_sources(roots: Iterable[Path], exclude: Path | Iterable[Path], relative_to: Path) -> Iterator[tuple[str, str]]:
    """``(relative file name, text)`` of every ``.py`` file under ``roots`` outside the ``exclude`` folders and files."""
    excluded = {exclude} if isinstance(exclude, Path) else set(exclude)
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path not in excluded and not excluded.intersection(path.parents):
                yield str(path.relative_to(relative_to)), path.read_text()
