"""Run one call per sample on daemon threads with a per-sample timeout.

Why not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at interpreter exit, so one hung scorer
would hang the whole program on exit, and a hung task keeps its pool slot forever. Here each call starts
``num_workers`` daemon threads that drain a shared job queue; a sample that runs longer than ``timeout_s`` is
reported as timed out, its thread is *abandoned* (Python cannot kill a thread: it keeps running in the background
until the scorer returns, and its result is discarded) and a replacement thread takes over the remaining jobs.
Threads overlap I/O-bound scorers (sandboxes, HTTP judges); CPU-bound pure-Python scorers are serialised by the GIL.
Process isolation (a scorer that never returns, leaks memory or crashes) is :mod:`verl.rewards._procpool`.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "run_with_timeouts"]


@dataclass
class Outcome:
    """Result of one sample: ``value`` on success, else ``error`` set or ``timed_out`` True."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _run_one(call: Callable[[int], Any], index: int) -> Outcome:
    start = time.monotonic()
    try:
        value = call(index)
        if inspect.isawaitable(value):  # `async def` reward functions are allowed (verl)
            value = asyncio.run(_await(value))
    except Exception as exc:
        return Outcome(error=exc, elapsed_s=time.monotonic() - start)
    return Outcome(value=value, elapsed_s=time.monotonic() - start)


class _Token:
    """Identity of one worker thread; ``abandoned`` is set when its current sample timed out."""

    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


def run_with_timeouts(
    call: Callable[[int], Any],
    n: int,
    *,
    num_workers: int,
    timeout_s: float | None,
    should_stop: Callable[[Outcome], bool] = lambda outcome: False,
) -> list[Outcome | None]:
    """Evaluate ``call(i)`` for ``i in range(n)``; return one :class:`Outcome` per index.

    Args:
        call: function of the sample index; may return an awaitable, which is run with ``asyncio.run``.
        n: number of samples.
        num_workers: threads running at a time (>= 1).
        timeout_s: per-sample limit in seconds, measured from the moment the sample starts running; ``None``
            waits forever. With ``None`` and one worker the calls run inline in the caller's thread.
        should_stop: checked on every outcome in completion order; ``True`` stops early (remaining samples are
            not started and their entries stay ``None``).
    """
    outcomes: list[Outcome | None] = [None] * n
    if n == 0:
        return outcomes
    if timeout_s is None and num_workers <= 1:
        for index in range(n):
            outcomes[index] = _run_one(call, index)
            if should_stop(outcomes[index]):
                break
        return outcomes

    jobs: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(n):
        jobs.put(index)
    done: queue.SimpleQueue[tuple[int, Outcome]] = queue.SimpleQueue()
    lock = threading.Lock()
    running: dict[int, tuple[float, _Token]] = {}
    stop = threading.Event()

    def work(token: _Token) -> None:
        while not stop.is_set():
            try:
                index = jobs.get_nowait()
            except queue.Empty:
                return
            with lock:
                running[index] = (time.monotonic(), token)
            try:
                outcome = _run_one(call, index)
            except BaseException as exc:  # noqa: BLE001 - a dying thread would leave its sample unresolved
                outcome = Outcome(error=exc)
            with lock:
                if token.abandoned:  # the caller already reported this sample as timed out
                    return
                running.pop(index, None)
            done.put((index, outcome))

    def spawn() -> None:
        threading.Thread(target=work, args=(_Token(),), name="verl-reward-worker", daemon=True).start()

    for _ in range(min(num_workers, n)):
        spawn()
    resolved = 0
    try:
        while resolved < n:
            wait = None
            if timeout_s is not None:
                with lock:
                    starts = [start for start, _ in running.values()]
                wait = max(0.0, min(starts) + timeout_s - time.monotonic()) if starts else timeout_s
            try:
                index, outcome = done.get(timeout=wait)
            except queue.Empty:
                pass
            else:
                outcomes[index] = outcome
                resolved += 1
                if should_stop(outcome):
                    break
            if timeout_s is None:
                continue
            now = time.monotonic()
            with lock:
                expired = [(i, start, tok) for i, (start, tok) in running.items() if now - start >= timeout_s]
                for index, _, token in expired:
                    token.abandoned = True
                    del running[index]
            stopped = False
            for index, start, _ in expired:
                outcomes[index] = Outcome(timed_out=True, elapsed_s=now - start)
                resolved += 1
                if not jobs.empty():
                    spawn()
                stopped = stopped or should_stop(outcomes[index])
            if stopped:
                break
    finally:
        stop.set()
    return outcomes
