"""Finding plugins: entry points of group ``verl.plugins``, the ``VERL_PLUGINS`` allow-list and
the plugin API version check. The records made here (:class:`PluginInfo`,
:class:`PluginLoadFailure`) are what ``verl plugins`` and the lookup errors show.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from verl.plugins.errors import IncompatiblePluginError, normalize_dist_name

ENTRY_POINT_GROUP = "verl.plugins"

#: Allow-list: comma-separated entry-point or distribution names (``VERL_PLUGINS=vllm,verl-fsdp``);
#: ``none`` loads only core's built-ins; unset or empty loads every installed plugin.
#: The built-in plugin is always loaded.
ENV_ALLOW_LIST = "VERL_PLUGINS"

#: The plugin API this verl-core serves: ``(major, minor)``. A plugin declaring
#: ``VERL_PLUGIN_API = (major, minor)`` is accepted when the majors are equal and its minor is
#: not newer than core's.
PLUGIN_API_VERSION: tuple[int, int] = (2, 6)

#: What a plugin built for an older major must change, by the major that changed it (shown when one is refused).
API_CHANGES: dict[int, str] = {
    2: (
        "engine factories take a required keyword 'options', the backend's options validated at config load "
        "(verl.config.role_options; an options_cls instance or None), and no longer read engine_kwargs "
        "themselves; checkpoint factories are factory(config, *, options, platform) "
        "(verl.plugins.factories, docs/plugin-authors.md)"
    ),
}

BUILTIN_MODULE = "verl.plugins.builtin"
CORE_DISTRIBUTION = "verl-core"


@attrs.frozen(kw_only=True)
class PluginInfo:
    """One plugin: an entry point (or a module registered by code) and where it comes from.

    Attributes:
        name: entry-point name (``"vllm"``), or the name given to ``PluginManager.register``.
        distribution: distribution that ships it (``"verl-vllm"``), ``None`` if unknown.
        version: that distribution's version, ``None`` if unknown.
        module: entry-point value / module name (``"verl_vllm.plugin"``).
        api_version: the plugin's ``VERL_PLUGIN_API``, ``None`` when it declares none.
        plugin: the loaded module/object; ``None`` for plugins that were not imported.
    """

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str = ""
    api_version: tuple[int, int] | None = None
    plugin: Any = attrs.field(default=None, eq=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors carrying PluginInfo cross process boundaries (Ray pickles worker exceptions); the
        # loaded module cannot be pickled, so it stays behind.
        fields = attrs.asdict(self, recurse=False, filter=lambda a, _: a.name != "plugin")
        return (_rebuild, (PluginInfo, fields))

    def describe(self) -> str:
        """``"verl-vllm 0.1.0 (entry point 'vllm', module verl_vllm.plugin)"``."""
        dist = self.distribution or "unknown distribution"
        if self.version:
            dist = f"{dist} {self.version}"
        module = f", module {self.module}" if self.module else ""
        return f"{dist} (entry point {self.name!r}{module})"


@attrs.frozen(kw_only=True)
class PluginLoadFailure:
    """A plugin that could not be used, and why.

    Attributes:
        plugin: the :class:`PluginInfo` of the failed entry point (``plugin`` field ``None``
            unless the module imported).
        stage: ``"import"`` (importing the entry point raised), ``"api_version"``
            (incompatible ``VERL_PLUGIN_API``), ``"validation"`` (breaks the hook API),
            ``"hook:<hook name>"`` (a hook raised or returned bad records) or ``"allow_list"``
            (``VERL_PLUGINS`` names a plugin that is not installed).
        error: ``"ExceptionType: message"``.
        exception: the exception object (``None`` for ``allow_list``).
    """

    plugin: PluginInfo
    stage: str
    error: str
    exception: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # The exception object may not pickle (required constructor arguments); ``error`` keeps its text.
        fields = attrs.asdict(self, recurse=False, filter=lambda a, _: a.name != "exception")
        return (_rebuild, (PluginLoadFailure, fields))

    def describe(self) -> str:
        """One line: who failed, at which stage, with which error."""
        return f"{self.plugin.describe()} [{self.stage}]: {self.error}"


def _rebuild(cls: type, fields: dict[str, Any]) -> Any:
    return cls(**fields)


def format_exception(exc: BaseException) -> str:
    """``"ModuleNotFoundError: No module named 'vllm'"``."""
    return f"{type(exc).__name__}: {exc}"


def check_api_version(declared: object, info: PluginInfo) -> tuple[int, int] | None:
    """Validate a plugin's ``VERL_PLUGIN_API`` against :data:`PLUGIN_API_VERSION`.

    Returns the declared version as a tuple (``None`` when the plugin declares none).

    Raises:
        IncompatiblePluginError: not a ``(major, minor)`` pair of ints, a different major, or
            a minor newer than core's; the message says which side to upgrade.
    """
    if declared is None:
        return None
    core_major, core_minor = PLUGIN_API_VERSION
    core = f"{core_major}.{core_minor}"
    if not (
        isinstance(declared, (tuple, list))
        and len(declared) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in declared)
    ):
        raise IncompatiblePluginError(
            f"plugin {info.describe()} declares VERL_PLUGIN_API={declared!r}; it must be a (major, minor) "
            f"tuple of ints such as ({core_major}, {core_minor})"
        )
    major, minor = declared
    if major != core_major:
        changed = [f"API {m}.0: {API_CHANGES[m]}" for m in sorted(API_CHANGES) if major < m <= core_major]
        raise IncompatiblePluginError(
            f"plugin {info.describe()} was built for verl plugin API {major}.{minor}, but this verl-core serves "
            f"API {core}: install a release of {info.distribution or 'the plugin'} built for API {core_major}.x, "
            f"or a verl-core serving API {major}.x" + (f" (what changed: {'; '.join(changed)})" if changed else "")
        )
    if minor > core_minor:
        raise IncompatiblePluginError(
            f"plugin {info.describe()} needs verl plugin API {major}.{minor}, but this verl-core serves API {core}: "
            "upgrade verl-core"
        )
    return (major, minor)


@attrs.frozen
class AllowList:
    """Parsed ``VERL_PLUGINS``: ``items`` is ``None`` when every plugin may load."""

    raw: str | None
    items: frozenset[str] | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AllowList:
        raw = (os.environ if environ is None else environ).get(ENV_ALLOW_LIST)
        if raw is None or not raw.strip():
            return cls(raw, None)
        items = {normalize_dist_name(p.strip()) for p in raw.split(",") if p.strip()}
        return cls(raw, frozenset() if items == {"none"} else frozenset(items))

    def allows(self, info: PluginInfo) -> bool:
        if self.items is None:
            return True
        return bool({normalize_dist_name(info.name), normalize_dist_name(info.distribution)} & self.items)

    def unmatched(self, infos: Iterable[PluginInfo]) -> list[str]:
        """Allow-list items matching no installed entry point or distribution (typos)."""
        if not self.items:
            return []
        known = set()
        for info in infos:
            known |= {normalize_dist_name(info.name), normalize_dist_name(info.distribution)}
        return sorted(self.items - known)


def entry_point_info(ep: importlib.metadata.EntryPoint) -> PluginInfo:
    """The :class:`PluginInfo` of an entry point, before it is imported."""
    dist = getattr(ep, "dist", None)
    name = version = None
    if dist is not None:
        name = dist.metadata["Name"] or getattr(dist, "name", None)
        version = dist.version
    return PluginInfo(name=ep.name, distribution=name, version=version, module=ep.value.strip())


def iter_entry_points() -> list[importlib.metadata.EntryPoint]:
    """Entry points of :data:`ENTRY_POINT_GROUP`, core's built-in first, then by distribution."""
    eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))

    def key(ep: importlib.metadata.EntryPoint) -> tuple[bool, str, str]:
        info = entry_point_info(ep)
        return (info.module != BUILTIN_MODULE, normalize_dist_name(info.distribution), ep.name)

    return sorted(eps, key=key)
