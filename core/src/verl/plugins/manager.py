"""The plugin manager: loads plugins, collects their spec records, answers lookups by name.

``get_plugin_manager()`` returns the process-wide manager. It is created on first call and
imports plugins on the first *query* (``get``, ``available``, ``plugins``, ...), never at
``import verl``; every process (driver, Ray worker) builds its own.

Loading, in order: core's built-in plugin (always), then every entry point of group
``verl.plugins`` allowed by ``VERL_PLUGINS`` (comma-separated entry-point or distribution
names; ``none`` = built-ins only; unset = all). A plugin that fails to import, declares an
incompatible ``VERL_PLUGIN_API`` or breaks the hook API is not registered; the failure is
recorded (``pm.failures``), logged as a warning, shown by ``verl plugins`` and appended to
every :class:`UnknownPluginError`. Discovery itself never raises because of a plugin.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
import threading
from collections.abc import Sequence
from typing import Any

import attrs
import pluggy

from verl.plugins import hookspecs
from verl.plugins.discovery import (
    BUILTIN_MODULE,
    CORE_DISTRIBUTION,
    AllowList,
    PluginInfo,
    PluginLoadFailure,
    check_api_version,
    entry_point_info,
    format_exception,
    iter_entry_points,
)
from verl.plugins.errors import (
    HINTED_KINDS,
    KNOWN_BACKENDS,
    IncompatiblePluginError,
    PluginConflictError,
    PluginValidationError,
    UnknownPluginError,
    known_backend_names,
    normalize_dist_name,
)
from verl.plugins.specs import KINDS, SPEC_TYPES, Spec

logger = logging.getLogger(__name__)

_HOOK_NAMES = frozenset(hookspecs.HOOK_FOR_KIND.values())


@attrs.frozen
class Claim:
    """One spec record together with the plugin that returned it."""

    spec: Spec
    plugin: PluginInfo


class PluginManager:
    """Registry of verl plugins on top of :class:`pluggy.PluginManager` (project ``"verl"``).

    Args:
        load_entry_points: when ``True`` (the default, used by :func:`get_plugin_manager`),
            the built-in plugin and the installed entry points are loaded on the first query.
            Tests pass ``False`` and :meth:`register` fake plugins instead.

    A name two plugins claim is never chosen silently: :meth:`get` of that name raises
    :class:`PluginConflictError` naming both providers, :meth:`available` and :meth:`providers`
    leave it out, and every other name of the kind keeps working. :meth:`claims` and
    :meth:`conflicts` report everything, conflicts included. Collected specs are
    cached per kind and the cache is dropped whenever a plugin is registered.
    """

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pluggy = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pluggy.add_hookspecs(hookspecs)
        self._loaded = not load_entry_points
        self._loading = False
        self._lock = threading.RLock()
        self._infos: dict[str, PluginInfo] = {}  # pluggy name -> info
        self._failures: list[PluginLoadFailure] = []
        self._disabled: list[PluginInfo] = []
        self._allow = AllowList(None, None)
        self._claims: dict[str, list[Claim]] = {}

    # ------------------------------------------------------------------ registration

    def register(
        self, plugin: Any, *, name: str | None = None, dist_name: str | None = None, version: str | None = None
    ) -> PluginInfo:
        """Register a plugin object (a module or any object with ``@hookimpl`` attributes).

        Args:
            plugin: the module/object.
            name: plugin name shown to users; defaults to the module's ``__name__``.
            dist_name, version: the distribution to name in reports and errors.

        Returns the :class:`PluginInfo` recorded for it.

        Raises:
            IncompatiblePluginError: its ``VERL_PLUGIN_API`` is not served by this core.
            PluginValidationError: it breaks the hook API, or is already registered.
        """
        module = getattr(plugin, "__name__", None) or f"{type(plugin).__module__}.{type(plugin).__qualname__}"
        info = PluginInfo(name=name or module, distribution=dist_name, version=version, module=module)
        self._ensure_loaded()
        return self._add(plugin, info)

    def _add(self, obj: Any, info: PluginInfo) -> PluginInfo:
        with self._lock:
            api_version = check_api_version(getattr(obj, "VERL_PLUGIN_API", None), info)
            info = attrs.evolve(info, plugin=obj, api_version=api_version)
            self._validate_hookimpls(obj, info)
            key = f"{info.distribution or ''}:{info.name}"
            if self._pluggy.is_registered(obj):
                other = self._infos[self._pluggy.get_name(obj)]
                raise PluginValidationError(f"plugin {info.describe()} is already registered as {other.describe()}")
            if self._pluggy.has_plugin(key):
                raise PluginValidationError(
                    f"plugin {info.describe()}: a plugin named {info.name!r} from the same distribution is "
                    "already registered"
                )
            try:
                self._pluggy.register(obj, name=key)
            except pluggy.PluginValidationError as exc:
                raise PluginValidationError(f"plugin {info.describe()} breaks the verl hook API: {exc}") from exc
            self._infos[key] = info
            self._claims.clear()
            return info

    def _validate_hookimpls(self, obj: Any, info: PluginInfo) -> None:
        problems = []
        for attr in sorted(dir(obj)):
            opts = self._pluggy.parse_hookimpl_opts(obj, attr)
            if opts is None:
                if attr in _HOOK_NAMES and callable(getattr(obj, attr, None)):
                    problems.append(f"{attr}() is not marked with @verl.plugins.hookimpl")
                continue
            hook = opts.get("specname") or attr
            if hook not in _HOOK_NAMES:
                problems.append(f"@hookimpl {attr}() matches no verl hook (hooks: {', '.join(sorted(_HOOK_NAMES))})")
            elif opts.get("wrapper") or opts.get("hookwrapper"):
                problems.append(f"@hookimpl {attr}() is a wrapper; verl hooks only collect lists of specs")
        if problems:
            raise PluginValidationError(f"plugin {info.describe()} breaks the verl hook API: " + "; ".join(problems))

    # ------------------------------------------------------------------ entry points

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        # The RLock makes other threads wait for the whole load; the loading thread itself may
        # re-enter (a plugin querying the manager while it is imported) and sees what is loaded so far.
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                self._load_entry_points()
            finally:
                self._loaded = True

    def _load_entry_points(self) -> None:
        self._allow = AllowList.from_env()
        seen: list[PluginInfo] = []
        builtin_found = False
        for ep in iter_entry_points():
            info = entry_point_info(ep)
            seen.append(info)
            is_builtin = info.module == BUILTIN_MODULE
            builtin_found |= is_builtin
            if not is_builtin and not self._allow.allows(info):
                self._disabled.append(info)
                continue
            self._load_one(ep, info)
        if not builtin_found:
            # Source tree without installed metadata: the built-ins are essential, register them directly.
            from verl import __version__
            from verl.plugins import builtin

            info = PluginInfo(
                name="builtin", distribution=CORE_DISTRIBUTION, version=__version__, module=BUILTIN_MODULE
            )
            self._add(builtin, info)
        for item in self._allow.unmatched(seen):
            self._fail(
                PluginInfo(name=item),
                "allow_list",
                f"VERL_PLUGINS={self._allow.raw!r} names {item!r}, but no installed plugin has that "
                "entry-point or distribution name",
            )

    def _load_one(self, ep: importlib.metadata.EntryPoint, info: PluginInfo) -> None:
        try:
            obj = ep.load()
        except Exception as exc:  # any import-time error of a third-party plugin: record, keep going
            self._fail(info, "import", exc)
            return
        try:
            self._add(obj, info)
        except IncompatiblePluginError as exc:
            self._fail(attrs.evolve(info, plugin=obj), "api_version", exc)
        except PluginValidationError as exc:
            self._fail(attrs.evolve(info, plugin=obj), "validation", exc)

    def _fail(self, info: PluginInfo, stage: str, error: BaseException | str) -> None:
        exc = error if isinstance(error, BaseException) else None
        text = format_exception(error) if exc is not None else str(error)
        failure = PluginLoadFailure(plugin=info, stage=stage, error=text, exception=exc)
        with self._lock:
            if failure in self._failures:
                return
            self._failures.append(failure)
        logger.warning("verl plugin %s failed [%s]: %s", info.describe(), stage, text)

    # ------------------------------------------------------------------ state

    @property
    def plugins(self) -> list[PluginInfo]:
        """Registered plugins, in load order (core's built-in first)."""
        self._ensure_loaded()
        return list(self._infos.values())

    @property
    def failures(self) -> list[PluginLoadFailure]:
        """Plugins that failed to import or register, and hooks that raised (for kinds collected so far)."""
        self._ensure_loaded()
        return list(self._failures)

    @property
    def disabled(self) -> list[PluginInfo]:
        """Installed entry points skipped because ``VERL_PLUGINS`` does not list them (not imported)."""
        self._ensure_loaded()
        return list(self._disabled)

    @property
    def allow_list(self) -> AllowList:
        """The ``VERL_PLUGINS`` allow-list read at load time."""
        self._ensure_loaded()
        return self._allow

    # ------------------------------------------------------------------ collection

    def claims(self, kind: str) -> list[Claim]:
        """Every spec of ``kind`` returned by every plugin, conflicts included (never raises for them).

        Raises:
            ValueError: ``kind`` is not one of :data:`verl.plugins.KINDS`.
        """
        _check_kind(kind)
        self._ensure_loaded()
        with self._lock:
            if kind not in self._claims:
                self._claims[kind] = self._collect(kind)
            return list(self._claims[kind])

    def _collect(self, kind: str) -> list[Claim]:
        hook = getattr(self._pluggy.hook, hookspecs.HOOK_FOR_KIND[kind])
        spec_type = SPEC_TYPES[kind]
        out: list[Claim] = []
        # Impls are called one by one (not via pluggy's multicall) to attribute each record and each
        # exception to its plugin; hooks take no arguments, so nothing of pluggy's calling is lost.
        for impl in hook.get_hookimpls():
            info = self._infos[impl.plugin_name]
            try:
                specs = _check_result(impl.function(), spec_type, hook.name, info)
            except Exception as exc:
                self._fail(info, f"hook:{hook.name}", exc)
                continue
            out.extend(Claim(spec=spec, plugin=info) for spec in specs)
        return out

    def distinct_claims(self, kind: str) -> list[Claim]:
        """:meth:`claims` with each provision counted once; never raises for conflicts.

        Two claims of one name are one provision when their spec records are equal (same function or
        factory) and they come from the same plugin, or one of them from core's built-in plugin: the
        built-in relays the ``register_adv_est`` / ``register_policy_loss`` registries, so a plugin that
        decorates a function *and* returns it as a spec would otherwise claim its name against core.
        The plugin's claim is kept (it is the provider ``verl plugins`` names), at the first one's place.

        Raises:
            ValueError: ``kind`` is not one of :data:`verl.plugins.KINDS`.
        """
        out: list[Claim] = []
        for claim in self.claims(kind):
            twin = next((i for i, kept in enumerate(out) if _same_provision(kept, claim)), None)
            if twin is None:
                out.append(claim)
            elif out[twin].plugin.module == BUILTIN_MODULE:
                out[twin] = claim
        return out

    def conflicts(self, kind: str) -> dict[str, tuple[PluginInfo, ...]]:
        """``{name: (every plugin claiming it, ...)}`` for names of ``kind`` claimed by more than one provision
        (see :meth:`distinct_claims`: the same function from the same plugin, or relayed by core, is one)."""
        by_name: dict[str, list[PluginInfo]] = {}
        for claim in self.distinct_claims(kind):
            by_name.setdefault(claim.spec.name, []).append(claim.plugin)
        return {name: tuple(infos) for name, infos in by_name.items() if len(infos) > 1}

    def conflict_error(self, kind: str, name: str) -> PluginConflictError | None:
        """The :class:`PluginConflictError` for ``name`` of ``kind`` when two plugins claim it, else ``None``.

        Its message names every provider (distribution, version, entry point) and the fix; it concerns that one
        name only, so an unrelated conflict never shows up in the error of another lookup.
        """
        infos = self.conflicts(kind).get(name)
        if infos is None:
            return None
        return PluginConflictError(
            f"{_label(kind)} {name!r} is provided by {len(infos)} plugins: "
            + "; ".join(info.describe() for info in infos)
            + "\nNeither is chosen silently: uninstall all but one of them, or list only one in VERL_PLUGINS.",
            kind=kind,
            conflicts={name: infos},
        )

    def _usable_claims(self, kind: str) -> list[Claim]:
        # A name claimed by two plugins is left out: no lookup may pick one of them silently.
        conflicting = self.conflicts(kind)
        return [c for c in self.distinct_claims(kind) if c.spec.name not in conflicting]

    def available(self, kind: str) -> dict[str, Spec]:
        """``{name: spec}`` of ``kind``, in load order, **without** names two plugins claim.

        A conflicting name is left out rather than resolved to one of its claimants; :meth:`get` raises
        :class:`PluginConflictError` for it, :meth:`conflicts` lists it. Names of ``kind`` nobody else claims
        stay usable whatever conflicts exist.

        Raises:
            ValueError: unknown ``kind``.
        """
        return {c.spec.name: c.spec for c in self._usable_claims(kind)}

    def providers(self, kind: str) -> dict[str, PluginInfo]:
        """``{name: PluginInfo of the plugin providing it}`` of ``kind``; conflicting names left out as in
        :meth:`available`."""
        return {c.spec.name: c.plugin for c in self._usable_claims(kind)}

    def provider(self, kind: str, name: str) -> PluginInfo:
        """The plugin providing ``name`` of ``kind``; raises like :meth:`get`."""
        self.get(kind, name)
        return self.providers(kind)[name]

    def provides(self, plugin: PluginInfo | str) -> dict[str, tuple[str, ...]]:
        """``{kind: (names, ...)}`` that ``plugin`` (a :class:`PluginInfo` or its name) provides; no
        raising on conflicts, kinds it provides nothing for are left out."""
        out: dict[str, tuple[str, ...]] = {}
        for kind in KINDS:
            names = tuple(
                c.spec.name
                for c in self.distinct_claims(kind)
                if (c.plugin == plugin if isinstance(plugin, PluginInfo) else c.plugin.name == plugin)
            )
            if names:
                out[kind] = names
        return out

    def get(self, kind: str, name: str) -> Spec:
        """The spec of ``kind`` called ``name``.

        Raises:
            ValueError: unknown ``kind``.
            TypeError: ``name`` is not a str.
            PluginConflictError: two plugins claim ``name`` (a conflict over another name does not
                matter here).
            UnknownPluginError: no plugin provides it; the message lists the available names,
                a close match, every plugin that failed to load (distribution, version, error),
                plugins disabled by ``VERL_PLUGINS`` and, for well-known backends, the
                ``pip install`` command.
        """
        if not isinstance(name, str):
            raise TypeError(f"{_label(kind)} name must be a str, got {type(name).__name__} ({name!r})")
        conflict = self.conflict_error(kind, name)
        if conflict is not None:
            raise conflict
        specs = self.available(kind)
        if name in specs:
            return specs[name]
        raise self._unknown(kind, name, list(specs))

    def _unknown(self, kind: str, name: str, names: Sequence[str]) -> UnknownPluginError:
        lines = [
            f"unknown {_label(kind)} {name!r}; "
            + (f"available: {', '.join(names)}" if names else f"no plugin provides any {_label(kind)}")
        ]
        conflicts = self.conflicts(kind)
        if conflicts:
            lines.append(
                "Not available because two plugins claim them: "
                + "; ".join(f"{n!r} ({', '.join(i.describe() for i in infos)})" for n, infos in conflicts.items())
            )
        failures = self.failures
        known = {normalize_dist_name(i.distribution) for i in [*self._infos.values(), *self._disabled]}
        known |= {normalize_dist_name(f.plugin.distribution) for f in failures}

        def missing(candidate: str) -> Any | None:
            """The hint of a well-known backend whose plugin is not installed at all, else None."""
            hint = KNOWN_BACKENDS.get(candidate) if kind in HINTED_KINDS else None
            if hint is None or hint.kind != kind or normalize_dist_name(hint.distribution) in known:
                return None
            return hint

        # Close matches among installed names and well-known names of this kind that are not installed, so
        # `vlm` still suggests `vllm` on a machine without verl-vllm.
        candidates = list(dict.fromkeys([*names, *(n for n in known_backend_names(kind) if missing(n))]))
        # A well-known name is not a typo (its plugin is installed but failed, or was filtered out): no guess.
        typo = name not in candidates and name not in known_backend_names(kind)
        close = difflib.get_close_matches(name, candidates, n=1) if typo else []
        if close:
            absent = missing(close[0]) if close[0] not in names else None
            lines.append(f"Did you mean {close[0]!r}?" + (" (not installed, see below)" if absent else ""))
        if failures:
            lines.append("Plugins that failed to load (one of them may provide it):")
            lines += [f"  - {f.describe()}" for f in failures]
        if self._disabled:
            lines.append(f"Plugins not loaded because VERL_PLUGINS={self._allow.raw!r} does not list them:")
            lines += [f"  - {info.describe()}" for info in self._disabled]
        wanted = name if missing(name) else (close[0] if close and close[0] not in names else None)
        hint = missing(wanted) if wanted else None
        if hint is not None:
            served = f" (as {hint.provided_as!r})" if hint.provided_as else ""
            lines.append(
                f"{wanted!r} is provided by the {hint.distribution} plugin{served}, which is not installed; "
                + hint.install()
            )
        return UnknownPluginError("\n".join(lines), kind=kind, name=name, available=names, failures=failures)


def _same_provision(a: Claim, b: Claim) -> bool:
    """Whether ``b`` repeats ``a`` (see :meth:`PluginManager.distinct_claims`)."""
    same_source = a.plugin == b.plugin or BUILTIN_MODULE in (a.plugin.module, b.plugin.module)
    return same_source and a.spec == b.spec


def _check_kind(kind: str) -> None:
    if kind not in SPEC_TYPES:
        raise ValueError(f"unknown plugin kind {kind!r}; expected one of: {', '.join(KINDS)}")


def _label(kind: str) -> str:
    return kind.replace("_", " ")


def _check_result(result: object, spec_type: type, hook: str, info: PluginInfo) -> list[Any]:
    if result is None:  # pluggy's convention: None means "nothing from me"
        return []
    if not isinstance(result, (list, tuple)):
        raise PluginValidationError(
            f"{hook}() of plugin {info.describe()} returned {type(result).__name__}; "
            f"it must return a list of {spec_type.__name__}"
        )
    bad = sorted({type(item).__name__ for item in result if not isinstance(item, spec_type)})
    if bad:
        raise PluginValidationError(
            f"{hook}() of plugin {info.describe()} returned {', '.join(bad)} items; "
            f"it must return a list of {spec_type.__name__}"
        )
    return list(result)


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide :class:`PluginManager` (created on first call, plugins loaded on first query)."""
    global _manager
    manager = _manager
    if manager is not None:
        return manager
    with _manager_lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager; the next :func:`get_plugin_manager` rediscovers plugins
    (re-reading ``VERL_PLUGINS``). For tests."""
    global _manager
    with _manager_lock:
        _manager = None
