"""``WorkerGroup``: the driver's handle on a set of workers, and the protocol every backend implements.

A backend (in-process :class:`~verl.controller.local.LocalWorkerGroup`, Ray actors) implements three
primitives:

* ``world_size``;
* ``_submit(rank, method_name, args, kwargs) -> handle`` starts one call on one worker;
* ``_wait(handles, timeout) -> list`` returns their results in order, raising
  :class:`~verl.controller.errors.WorkerError` for the lowest failing rank (a Ray handle is an
  ``ObjectRef``; ``_wait`` is ``ray.get`` plus error mapping); ``_done(handles)`` tells whether
  ``_wait`` would block.

Everything else is shared, so every backend returns identical results for identical inputs:
``execute_all`` / ``execute_rank_zero`` (sync and async), and the binding of the worker class's
``@register``-ed methods as driver-side methods that dispatch -> execute -> collect. Source:
verl/single_controller/base/worker_group.py and verl/single_controller/ray/base.py (``func_generator``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from verl.controller.decorator import Execute, resolve_dispatch_mode
from verl.controller.dispatch import PADDED_ROWS_KWARG, PADDING_SIZE_KWARG, strip_padding
from verl.controller.futures import WorkerFuture, materialize_futures


class ClassWithInitArgs:
    """A worker class and the arguments to construct it with, deferred until the group places the workers.

    ``ClassWithInitArgs(cls, *args, **kwargs)()`` returns ``cls(*args, **kwargs)``.

    Raises:
        TypeError: ``cls`` is not a class.
    """

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"ClassWithInitArgs needs a class as first argument, got {type(cls).__name__}")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"ClassWithInitArgs({self.cls.__name__}, args={self.args!r}, kwargs={self.kwargs!r})"


class WorkerGroup(abc.ABC):
    """A group of ``world_size`` workers of one class, driven from a single controller.

    For every ``@register``-ed method ``m`` of the worker class, the group has a driver-side ``m`` that
    dispatches the arguments, executes on the ranks named by the execute mode, waits (when blocking)
    and collects; non-blocking methods return a :class:`WorkerFuture` of the collected value.
    """

    #: The worker class (set by backends that know it; ``None`` for views).
    worker_cls: type | None = None
    #: Ids of the nodes the workers run on (Ray node ids); empty for an in-process group (the driver's node).
    node_ids: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self._method_attrs: dict[str, dict] = {}

    # ---- backend primitives ------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """Number of workers in the group."""

    @abc.abstractmethod
    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        """Start ``method_name(*args, **kwargs)`` on worker ``rank``; return a handle for :meth:`_wait`.

        Raises ``AttributeError`` (before running anything) if the worker has no such method.
        """

    @abc.abstractmethod
    def _wait(self, handles: Sequence[Any], timeout: float | None = None) -> list:
        """Results of ``handles`` in order; raise ``WorkerError`` for the lowest failing rank."""

    def _done(self, handles: Sequence[Any]) -> bool:
        """Whether :meth:`_wait` would return without blocking (in-process: always)."""
        return True

    @property
    def worker_class_name(self) -> str:
        """Name of the worker class, for messages."""
        return self.worker_cls.__name__ if self.worker_cls is not None else type(self).__name__

    # ---- execution -----------------------------------------------------------------------------------

    def _per_rank(self, args: tuple, kwargs: dict) -> list[tuple[tuple, dict]]:
        # verl's execute_all rule: scatter when every argument is a list with one entry per rank,
        # broadcast otherwise.
        n = self.world_size
        values = [*args, *kwargs.values()]
        if all(isinstance(v, list) and len(v) == n for v in values):
            return [(tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()}) for i in range(n)]
        return [(args, kwargs)] * n

    def _future(self, handles: list, finalize: Callable[[list], Any]) -> WorkerFuture:
        return WorkerFuture(lambda timeout: finalize(self._wait(handles, timeout)), lambda: self._done(handles))

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        """Run ``method_name`` on every rank without waiting; the future yields the per-rank list.

        Arguments are scattered when *every* positional and keyword argument is a list of length
        ``world_size`` (element ``i`` to rank ``i``), and broadcast otherwise (verl's rule; note that with
        ``world_size == 1`` a one-element list is therefore unwrapped).
        """
        handles = [self._submit(rank, method_name, a, k) for rank, (a, k) in enumerate(self._per_rank(args, kwargs))]
        return self._future(handles, list)

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """Run ``method_name`` on every rank and return the results in rank order (see ``execute_all_async``).

        Raises:
            WorkerError: a worker raised; names the class, the lowest failing rank and the method.
        """
        return self.execute_all_async(method_name, *args, **kwargs).get()

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        """Run ``method_name(*args, **kwargs)`` on rank 0 only without waiting; the future yields its value."""
        handles = [self._submit(0, method_name, args, kwargs)]
        return self._future(handles, lambda outputs: outputs[0])

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name(*args, **kwargs)`` on rank 0 only and return its value."""
        return self.execute_rank_zero_async(method_name, *args, **kwargs).get()

    execute_all_sync = execute_all
    execute_rank_zero_sync = execute_rank_zero

    # ---- binding of @register-ed methods --------------------------------------------------------------

    @property
    def method_names(self) -> list[str]:
        """Names of the driver-side methods bound from the worker class's ``@register``-ed methods."""
        return sorted(self._method_attrs)

    def _bind_worker_methods(self, methods: dict[str, dict]) -> None:
        """Bind ``{name: register attrs}`` as driver-side methods of this group instance.

        Raises:
            ValueError: a method name collides with a ``WorkerGroup`` attribute (rename the worker method).
        """
        for name, attrs in methods.items():
            if hasattr(self, name):
                raise ValueError(
                    f"{self.worker_class_name}.{name} cannot be bound on {type(self).__name__}: the group already has "
                    f"an attribute {name!r}. Rename the worker method."
                )
            setattr(self, name, self._make_method(name, attrs))
            self._method_attrs[name] = attrs

    def call_async(self, method_name: str, *args: Any, **kwargs: Any) -> WorkerFuture:
        """Call the ``@register``-ed method ``method_name`` without waiting, whatever its ``blocking`` flag.

        Dispatch and collection are the method's own; the returned :class:`WorkerFuture` yields what the
        blocking call would have returned (the one-step off-policy trainer starts the next step's generation
        with it and trains meanwhile). The in-process group runs the call before returning.

        Raises:
            AttributeError: the worker class has no ``@register``-ed method of that name.
        """
        attrs = self._method_attrs.get(method_name)
        if attrs is None:
            raise AttributeError(
                f"{self.worker_class_name} has no @register-ed method {method_name!r}; known: {self.method_names}"
            )
        return self._make_method(method_name, {**attrs, "blocking": False})(*args, **kwargs)

    def _make_method(self, name: str, attrs: dict) -> Callable[..., Any]:
        dispatch_fn, collect_fn = resolve_dispatch_mode(attrs["dispatch_mode"])
        rank_zero = attrs["execute_mode"] is Execute.RANK_ZERO
        blocking = attrs["blocking"]

        def method(*args: Any, **kwargs: Any) -> Any:
            # Dispatch must see real values (a DataProto's row count decides the chunking), so a future
            # handed over from another group's non-blocking call is waited for here, on the driver.
            args, kwargs = materialize_futures(args, kwargs)
            dispatched = dispatch_fn(self, *args, **kwargs)
            if not (isinstance(dispatched, tuple) and len(dispatched) == 2 and isinstance(dispatched[1], dict)):
                raise TypeError(
                    f"dispatch_fn of {self.worker_class_name}.{name} must return (args, kwargs), "
                    f"got {type(dispatched).__name__}"
                )
            d_args, d_kwargs = tuple(dispatched[0]), dict(dispatched[1])
            pad_size = d_kwargs.pop(PADDING_SIZE_KWARG, 0)
            padded_rows = d_kwargs.pop(PADDED_ROWS_KWARG, None)
            if rank_zero:
                handles = [self._submit(0, name, d_args, d_kwargs)]
            else:
                per_rank = self._per_rank(d_args, d_kwargs)
                handles = [self._submit(rank, name, a, k) for rank, (a, k) in enumerate(per_rank)]

            def finalize(outputs: list) -> Any:
                collected = collect_fn(self, outputs[0] if rank_zero else outputs)
                return strip_padding(collected, pad_size, padded_rows)

            future = self._future(handles, finalize)
            return future.get() if blocking else future

        method.__name__ = name
        method.__qualname__ = f"{type(self).__name__}.{name}"
        mode = attrs["dispatch_mode"]
        mode_name = getattr(mode, "name", "custom")
        method.__doc__ = (
            f"Driver-side {name}: dispatch={mode_name}, execute={attrs['execute_mode'].name}, blocking={blocking}."
        )
        return method

    # ---- colocation ----------------------------------------------------------------------------------

    def spawn(self, prefix_set: Iterable[str]) -> dict[str, WorkerGroup]:
        """One view per role of a colocated group: on the view for ``role``, ``m`` calls ``{role}_m``.

        The views share this group's workers (no new process). See :mod:`verl.controller.colocate`.

        Raises:
            ValueError: a prefix matches no bound method (lists the prefixes that would).
        """
        if isinstance(prefix_set, str):
            prefix_set = [prefix_set]
        views: dict[str, WorkerGroup] = {}
        for prefix in prefix_set:
            if not any(name.startswith(f"{prefix}_") for name in self._method_attrs):
                roles = getattr(self.worker_cls, "colocated_roles", ())
                available = ", ".join(roles) if roles else "none (build the class with create_colocated_worker_cls)"
                raise ValueError(
                    f"spawn: no method of {self.worker_class_name} starts with '{prefix}_'; roles available: {available}"
                )
            views[prefix] = _PrefixedWorkerGroup(self, prefix)
        return views


class _PrefixedWorkerGroup(WorkerGroup):
    """A view of a colocated group for one role: method ``m`` runs ``{prefix}_m`` on the shared workers."""

    def __init__(self, parent: WorkerGroup, prefix: str) -> None:
        super().__init__()
        self._parent = parent
        self.prefix = prefix
        start = f"{prefix}_"
        self._bind_worker_methods(
            {name[len(start) :]: attrs for name, attrs in parent._method_attrs.items() if name.startswith(start)}
        )

    @property
    def world_size(self) -> int:
        return self._parent.world_size

    @property
    def worker_class_name(self) -> str:
        return self._parent.worker_class_name

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> Any:
        return self._parent._submit(rank, f"{self.prefix}_{method_name}", args, kwargs)

    def _wait(self, handles: Sequence[Any], timeout: float | None = None) -> list:
        return self._parent._wait(handles, timeout)

    def _done(self, handles: Sequence[Any]) -> bool:
        return self._parent._done(handles)

    def __repr__(self) -> str:
        return f"<{self.worker_class_name} view {self.prefix!r} world_size={self.world_size}>"
