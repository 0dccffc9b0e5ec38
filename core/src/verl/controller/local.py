"""``LocalWorkerGroup``: workers living in the driver process.

``world_size=1`` is the embedded default (one worker, no Ray). ``world_size > 1`` builds N workers in this
process with ranks ``0..N-1`` and runs every call on them one after another, in rank order; that
exercises the dispatch modes exactly as a Ray group would, without processes. It does **not**
initialise ``torch.distributed`` (each worker sees ``WORLD_SIZE=N`` but there is no process group), so
workers that need collectives must run under the Ray group or ``torchrun``.

Calls run to completion before ``_submit`` returns, so a non-blocking method returns a future that is
already resolved; a failure is still only raised by its ``.get()``, as with Ray. ``async def`` worker
methods run on one event loop per group (a daemon thread started on first use), like a Ray async actor.

Arguments are handed over by reference (no serialisation), which the colocated weight hand-over relies
on. ``isolate_args=True`` round-trips every argument and result through ``pickle`` as a Ray call would,
to catch workers that mutate their inputs or arguments that could not cross a process boundary.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import threading
from collections.abc import Sequence
from typing import Any

from verl.controller.decorator import registered_methods
from verl.controller.errors import WorkerError
from verl.controller.worker import WorkerMeta, assigned_identity
from verl.controller.worker_group import ClassWithInitArgs, WorkerGroup


class _Outcome:
    """Handle of one finished in-process call: its value or the exception it raised."""

    __slots__ = ("rank", "method_name", "value", "error")

    def __init__(self, rank: int, method_name: str, value: Any = None, error: BaseException | None = None) -> None:
        self.rank = rank
        self.method_name = method_name
        self.value = value
        self.error = error


def _roundtrip(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class LocalWorkerGroup(WorkerGroup):
    """In-process worker group (see the module docstring for what it does and does not emulate).

    Args:
        cls_with_init: the worker class and its constructor arguments.
        world_size: number of workers (>= 1); worker ``i`` gets rank ``i`` and local rank ``i``.
        isolate_args: pickle round-trip of arguments and results (Ray-like isolation; slower).
        master_addr / master_port: reported to the workers through ``Worker.get_master_addr_port``.

    Raises:
        TypeError: ``cls_with_init`` is not a ``ClassWithInitArgs``. ValueError: ``world_size < 1``.
        WorkerError: a worker's constructor raised (method ``__init__``, with its rank).
    """

    def __init__(
        self,
        cls_with_init: ClassWithInitArgs,
        world_size: int = 1,
        *,
        isolate_args: bool = False,
        master_addr: str | None = None,
        master_port: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(cls_with_init, ClassWithInitArgs):
            raise TypeError(
                f"LocalWorkerGroup needs a ClassWithInitArgs, got {type(cls_with_init).__name__}; "
                "wrap the class: LocalWorkerGroup(ClassWithInitArgs(MyWorker, *init_args), world_size=...)"
            )
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"LocalWorkerGroup world_size must be an int >= 1, got {world_size!r}")
        self.worker_cls = cls_with_init.cls
        self._world_size = world_size
        self._isolate = isolate_args
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._workers: list[Any] = []
        for rank in range(world_size):
            meta = WorkerMeta(
                rank=rank,
                world_size=world_size,
                local_rank=rank,
                local_world_size=world_size,
                master_addr=master_addr,
                master_port=master_port,
            )
            init = cls_with_init
            if isolate_args:  # the class itself travels by reference; its arguments are copied per worker
                args, kwargs = _roundtrip((cls_with_init.args, cls_with_init.kwargs))
                init = ClassWithInitArgs(cls_with_init.cls, *args, **kwargs)
            try:
                with assigned_identity(meta):
                    self._workers.append(init())
            except Exception as exc:
                raise WorkerError(self.worker_class_name, rank, "__init__", exc, world_size=world_size) from exc
        self._bind_worker_methods(registered_methods(self.worker_cls))

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def workers(self) -> list[Any]:
        """The worker instances, in rank order (direct access for embedding and tests)."""
        return list(self._workers)

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> _Outcome:
        if not 0 <= rank < self._world_size:
            raise IndexError(f"rank {rank} is outside this group's world size {self._world_size}")
        fn = getattr(self._workers[rank], method_name, None)
        if not callable(fn):
            raise AttributeError(
                f"{self.worker_class_name} has no method {method_name!r}; "
                f"registered methods: {', '.join(self.method_names) or 'none'}"
            )
        if self._isolate:
            try:
                args, kwargs = _roundtrip((args, kwargs))
            except Exception as exc:
                raise TypeError(
                    f"arguments of {self.worker_class_name}.{method_name} for rank {rank} cannot be pickled "
                    f"({type(exc).__name__}: {exc}); a Ray worker could not receive them either"
                ) from exc
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = self._run_awaitable(value)
            if self._isolate:
                value = _roundtrip(value)
        except Exception as exc:
            return _Outcome(rank, method_name, error=exc)
        return _Outcome(rank, method_name, value=value)

    def _wait(self, handles: Sequence[_Outcome], timeout: float | None = None) -> list:
        failed = [h for h in handles if h.error is not None]
        if failed:
            first = failed[0]
            raise WorkerError(
                self.worker_class_name,
                first.rank,
                first.method_name,
                first.error,
                world_size=self._world_size,
                failed_ranks=tuple(h.rank for h in failed),
            ) from first.error
        return [h.value for h in handles]

    # ---- async methods -------------------------------------------------------------------------------

    def _run_awaitable(self, awaitable: Any) -> Any:
        async def wrap() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrap(), self._event_loop()).result()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        # One persistent loop (like a Ray async actor's) so state bound to a loop survives across calls,
        # and so calls work whether or not the driver itself runs inside an event loop.
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="verl-local-worker-loop", daemon=True)
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def shutdown(self) -> None:
        """Stop the event loop of ``async`` methods, if one was started. The workers stay usable."""
        with self._loop_lock:
            loop, thread = self._loop, self._loop_thread
            self._loop, self._loop_thread = None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __repr__(self) -> str:
        return f"<LocalWorkerGroup {self.worker_class_name} world_size={self._world_size}>"
