"""Futures returned by non-blocking worker-group calls.

A :class:`WorkerFuture` is what ``@register(blocking=False)`` methods and ``execute_*_async`` return.
It follows :class:`concurrent.futures.Future` (``result``, ``done``, ``exception``) and verl's
``DataProtoFuture`` (``get``). The group supplies two callables, so a backend maps its own handles onto
it: the in-process group hands over results that are already computed, the Ray group ``ray.get``-s
its ``ObjectRef``-s inside ``wait``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_UNSET = object()


class WorkerFuture:
    """The eventual (collected) result of a worker-group call.

    Args:
        wait: ``wait(timeout)`` blocks until the call finished (at most ``timeout`` seconds, ``None``
            = forever) and returns the final value or raises (typically
            :class:`~verl.controller.errors.WorkerError`). Called at most once unless it raises
            :class:`TimeoutError`.
        is_done: returns ``True`` once ``wait`` would not block; defaults to "always done".

    The value or the error is cached: every ``result()`` returns the same object or re-raises the
    same exception.
    """

    def __init__(self, wait: Callable[[float | None], Any], is_done: Callable[[], bool] | None = None) -> None:
        self._wait = wait
        self._is_done = is_done
        self._lock = threading.Lock()
        self._value: Any = _UNSET
        self._error: BaseException | None = None

    def _settle(self, timeout: float | None) -> None:
        with self._lock:
            if self._value is not _UNSET or self._error is not None:
                return
            try:
                self._value = self._wait(timeout)
            except TimeoutError:
                raise  # not final: the caller may wait again
            except Exception as exc:
                self._error = exc

    def result(self, timeout: float | None = None) -> Any:
        """Block until the value is available and return it; re-raise the call's error.

        Raises:
            WorkerError: a worker failed. TimeoutError: ``timeout`` seconds passed (backend-dependent).
        """
        self._settle(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def get(self, timeout: float | None = None) -> Any:
        """Alias of :meth:`result` (verl's ``DataProtoFuture.get`` / ``ray.get`` spelling)."""
        return self.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until done and return the call's error, or ``None`` if it succeeded."""
        self._settle(timeout)
        return self._error

    def done(self) -> bool:
        """``True`` once :meth:`result` would return without blocking."""
        if self._value is not _UNSET or self._error is not None:
            return True
        return True if self._is_done is None else bool(self._is_done())

    def __repr__(self) -> str:
        if self._error is not None:
            state = f"failed: {type(self._error).__name__}"
        elif self._value is not _UNSET:
            state = "finished"
        else:
            state = "pending"
        return f"<WorkerFuture {state}>"


def materialize_futures(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Replace every top-level :class:`WorkerFuture` in ``args`` / ``kwargs`` by its value (waits for it)."""
    args = tuple(a.get() if isinstance(a, WorkerFuture) else a for a in args)
    kwargs = {k: v.get() if isinstance(v, WorkerFuture) else v for k, v in kwargs.items()}
    return args, kwargs
