"""``@register``: how a worker method is dispatched, executed and collected by its worker group.

A worker class marks the methods the driver may call::

    class ActorWorker(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self): ...

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def compute_log_prob(self, data: DataProto) -> DataProto: ...

and every worker group built on that class gets a driver-side ``group.compute_log_prob(data)`` that
dispatches the arguments to the ranks, executes on them and collects the outputs (see
:mod:`verl.controller.dispatch` for the modes). Source: verl/single_controller/base/decorator.py.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from verl.controller import dispatch as _d
from verl.controller import futures as _futures

#: Name of the function attribute under which :func:`register` stores
#: ``{"dispatch_mode": Dispatch | dict, "execute_mode": Execute, "blocking": bool}``. The value is verl's
#: (``attrs_3141562937``) so worker classes written for verl are recognised unchanged.
MAGIC_ATTR = "attrs_3141562937"


class _DynamicEnumMeta(type):
    def __iter__(cls) -> Iterator[Any]:
        return iter(cls._members.values())

    def __len__(cls) -> int:
        return len(cls._members)

    def __contains__(cls, item: object) -> bool:
        return isinstance(item, cls) and cls._members.get(item.name) is item

    def __getitem__(cls, name: str) -> Any:
        return cls.from_name(name)


def _member_by_name(enum_cls: type[DynamicEnum], name: str) -> DynamicEnum:
    return enum_cls.from_name(name)


class DynamicEnum(metaclass=_DynamicEnumMeta):
    """An enum whose members can be added at runtime (verl's ``DynamicEnum``).

    Members are singletons reachable as class attributes (``Dispatch.ONE_TO_ALL``), by name
    (``Dispatch["ONE_TO_ALL"]``) and by iteration; they pickle by name, so a worker process resolves them
    to its own singletons.
    """

    _members: dict[str, DynamicEnum]
    _next_value: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._members = {}
        cls._next_value = 0

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple:
        return _member_by_name, (type(self), self.name)

    @classmethod
    def register(cls, name: str) -> DynamicEnum:
        """Add member ``name`` (an upper-case identifier); raises ``ValueError`` if it exists."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{cls.__name__} member name must be an identifier, got {name!r}")
        if name in cls._members or hasattr(cls, name):
            raise ValueError(f"{cls.__name__}.{name} already exists; pick another name")
        member = cls(name, cls._next_value)
        cls._next_value += 1
        cls._members[name] = member
        setattr(cls, name, member)
        return member

    @classmethod
    def remove(cls, name: str) -> None:
        """Remove member ``name``; raises ``KeyError`` listing the members if it does not exist."""
        cls.from_name(name)
        del cls._members[name]
        delattr(cls, name)

    @classmethod
    def from_name(cls, name: str) -> DynamicEnum:
        """Member called ``name``; raises ``KeyError`` listing the known names."""
        try:
            return cls._members[name]
        except KeyError:
            raise KeyError(f"unknown {cls.__name__} {name!r}; known: {', '.join(cls._members)}") from None

    @classmethod
    def names(cls) -> list[str]:
        return list(cls._members)


class Dispatch(DynamicEnum):
    """How a call's arguments are split across ranks and the outputs joined (see :mod:`.dispatch`).

    ``ONE_TO_ALL`` replicate args, return the list · ``ALL_TO_ALL`` pass through, return the list ·
    ``RANK_ZERO`` run on rank 0 only, return its value · ``DP_COMPUTE`` args are per-rank lists, return
    the list · ``DP_COMPUTE_PROTO`` chunk DataProto args (padding to a multiple of world size), concat
    the outputs and strip the padding · ``DP_COMPUTE_METRIC`` chunk like DP_COMPUTE_PROTO, return the list.
    """


class Execute(DynamicEnum):
    """Which ranks run the method: ``ALL`` (``execute_all``) or ``RANK_ZERO`` (``execute_rank_zero``)."""


for _name in ("RANK_ZERO", "ONE_TO_ALL", "ALL_TO_ALL", "DP_COMPUTE", "DP_COMPUTE_PROTO", "DP_COMPUTE_METRIC"):
    Dispatch.register(_name)
for _name in ("ALL", "RANK_ZERO"):
    Execute.register(_name)

DispatchFn = Callable[..., tuple[tuple, dict]]
CollectFn = Callable[[Any, Any], Any]

_DISPATCH_FNS: dict[str, dict[str, Callable]] = {
    "RANK_ZERO": {"dispatch_fn": _d.dispatch_all_to_all, "collect_fn": _d.collect_all_to_all},
    "ONE_TO_ALL": {"dispatch_fn": _d.dispatch_one_to_all, "collect_fn": _d.collect_all_to_all},
    "ALL_TO_ALL": {"dispatch_fn": _d.dispatch_all_to_all, "collect_fn": _d.collect_all_to_all},
    "DP_COMPUTE": {"dispatch_fn": _d.dispatch_dp_compute, "collect_fn": _d.collect_dp_compute},
    "DP_COMPUTE_PROTO": {
        "dispatch_fn": _d.dispatch_dp_compute_data_proto,
        "collect_fn": _d.collect_dp_compute_data_proto,
    },
    "DP_COMPUTE_METRIC": {
        "dispatch_fn": _d.dispatch_dp_compute_data_proto,
        "collect_fn": _d.collect_dp_compute_metric,
    },
}
_BUILTIN_MODES = frozenset(_DISPATCH_FNS)


def _check_fns(dispatch_fn: Any, collect_fn: Any, where: str) -> None:
    for label, fn in (("dispatch_fn", dispatch_fn), ("collect_fn", collect_fn)):
        if not callable(fn):
            raise TypeError(f"{where}: {label} must be callable, got {type(fn).__name__}")


def register_dispatch_mode(name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> Dispatch:
    """Add a dispatch mode ``Dispatch.<name>`` for extensions (e.g. an engine's mesh-aware mode).

    ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)`` and
    ``collect_fn(worker_group, outputs) -> result`` follow the contract in :mod:`verl.controller.dispatch`.

    Returns:
        the new ``Dispatch`` member. Raises ``ValueError`` if the name exists, ``TypeError`` if a function
        is not callable.
    """
    _check_fns(dispatch_fn, collect_fn, f"register_dispatch_mode({name!r})")
    member = Dispatch.register(name)
    _DISPATCH_FNS[name] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return member


def update_dispatch_mode(dispatch_mode: Dispatch, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> None:
    """Replace the functions of an existing mode (verl's ``update_dispatch_mode``)."""
    if dispatch_mode not in Dispatch:
        raise KeyError(f"unknown dispatch mode {dispatch_mode!r}; known: {', '.join(Dispatch.names())}")
    _check_fns(dispatch_fn, collect_fn, f"update_dispatch_mode({dispatch_mode.name})")
    _DISPATCH_FNS[dispatch_mode.name] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def unregister_dispatch_mode(name: str) -> None:
    """Remove a mode added with :func:`register_dispatch_mode`; built-in modes cannot be removed."""
    if name in _BUILTIN_MODES:
        raise ValueError(f"Dispatch.{name} is built in and cannot be removed")
    Dispatch.remove(name)
    del _DISPATCH_FNS[name]


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict[str, Callable]:
    """``{"dispatch_fn", "collect_fn"}`` of a registered mode; ``KeyError`` listing the modes otherwise."""
    if dispatch_mode not in Dispatch:
        raise KeyError(f"unknown dispatch mode {dispatch_mode!r}; known: {', '.join(Dispatch.names())}")
    return dict(_DISPATCH_FNS[dispatch_mode.name])


def resolve_dispatch_mode(dispatch_mode: Dispatch | dict) -> tuple[DispatchFn, CollectFn]:
    """``(dispatch_fn, collect_fn)`` for a ``Dispatch`` member or a custom ``{"dispatch_fn", "collect_fn"}``."""
    fns = dispatch_mode if isinstance(dispatch_mode, dict) else get_predefined_dispatch_fn(dispatch_mode)
    return fns["dispatch_fn"], fns["collect_fn"]


def _validate_dispatch_mode(dispatch_mode: Any) -> None:
    if isinstance(dispatch_mode, dict):
        keys = set(dispatch_mode)
        if keys != {"dispatch_fn", "collect_fn"}:
            raise ValueError(
                "a custom dispatch_mode must be a dict with exactly the keys 'dispatch_fn' and 'collect_fn', "
                f"got keys {sorted(keys)}"
            )
        _check_fns(dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"], "custom dispatch_mode")
    elif callable(dispatch_mode) and not isinstance(dispatch_mode, DynamicEnum):
        raise TypeError("@register must be called: write @register() or @register(dispatch_mode=...)")
    elif dispatch_mode not in Dispatch:
        raise TypeError(
            f"dispatch_mode must be a Dispatch member or a {{'dispatch_fn', 'collect_fn'}} dict, got {dispatch_mode!r}"
        )


def register(
    dispatch_mode: Dispatch | dict = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable from the driver through its worker group.

    Args:
        dispatch_mode: a :class:`Dispatch` member or a custom ``{"dispatch_fn": f, "collect_fn": g}``.
            ``Dispatch.RANK_ZERO`` implies ``Execute.RANK_ZERO``.
        execute_mode: ``Execute.ALL`` runs on every rank; ``Execute.RANK_ZERO`` on rank 0 with the
            caller's arguments unchanged (allowed with ``ALL_TO_ALL`` and ``RANK_ZERO`` dispatch only).
        blocking: ``False`` makes the driver-side method return a :class:`WorkerFuture`.
        materialize_futures: worker-side, replace any :class:`WorkerFuture` argument by its value before
            the method runs.

    The attributes are stored as a dict under :data:`MAGIC_ATTR` on the returned wrapper. ``async def``
    methods stay coroutine functions.

    Raises:
        TypeError: unknown mode types, non-bool ``blocking``, or ``@register`` used without parentheses.
        ValueError: malformed custom mode dict, or ``Execute.RANK_ZERO`` with a mode that splits arguments.
    """
    _validate_dispatch_mode(dispatch_mode)
    if execute_mode not in Execute:
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be a bool, got {type(blocking).__name__}")
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    if execute_mode is Execute.RANK_ZERO and dispatch_mode not in (Dispatch.ALL_TO_ALL, Dispatch.RANK_ZERO):
        shown = dispatch_mode.name if isinstance(dispatch_mode, DynamicEnum) else "a custom mode"
        raise ValueError(
            f"Execute.RANK_ZERO passes the caller's arguments unchanged to rank 0, which does not fit {shown}; "
            "use dispatch_mode=Dispatch.RANK_ZERO (or ALL_TO_ALL), or execute_mode=Execute.ALL"
        )
    attrs = {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking}

    def decorator(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                if materialize_futures:
                    args, kwargs = _futures.materialize_futures(args, kwargs)
                return await func(*args, **kwargs)

        else:

            @functools.wraps(func)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if materialize_futures:
                    args, kwargs = _futures.materialize_futures(args, kwargs)
                return func(*args, **kwargs)

        setattr(wrapper, MAGIC_ATTR, dict(attrs))
        return wrapper

    return decorator


def get_register_attrs(obj: Any) -> dict | None:
    """The ``@register`` attributes of a function or method, or ``None`` if it is not registered."""
    attrs = getattr(obj, MAGIC_ATTR, None)
    return attrs if isinstance(attrs, dict) else None


def registered_methods(cls: type) -> dict[str, dict]:
    """``{method_name: attrs}`` for every ``@register``-ed method of ``cls`` (inherited ones included)."""
    found: dict[str, dict] = {}
    for name in dir(cls):
        try:
            member = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        attrs = get_register_attrs(member)
        if attrs is not None and callable(member):
            found[name] = attrs
    return found
