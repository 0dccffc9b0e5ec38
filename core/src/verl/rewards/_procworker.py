"""The reward worker process: ``python -m verl.rewards._procworker <conn_fd> <progress_fd>``.

A fresh interpreter started by :class:`verl.rewards._procpool.ScorerProcessPool` with ``subprocess`` (not
``multiprocessing``: a spawn/forkserver child re-imports the trainer's ``__main__`` script, which breaks user
scripts without an ``if __name__ == "__main__"`` guard; a fork would copy a trainer holding torch threads and
locks). It reads its :class:`ScorerSpec` and memory limit from the pipe, imports the scorer once, reports
``ready`` (or ``load_error``), then scores chunks of samples until the pipe closes.

While it scores, it keeps two doubles in a shared ``mmap`` (``progress_fd``): the position in the chunk of the
sample it is running (``-1`` when idle) and ``time.monotonic()`` at its start (CLOCK_MONOTONIC, system-wide on
Linux and macOS), so the parent can time out and blame exactly that sample without a message per sample.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import inspect
import mmap
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from verl.rewards._pool import _await
from verl.rewards.errors import RewardConfigError
from verl.rewards.process_limits import die_with_parent as _die_with_parent
from verl.rewards.process_limits import limit_memory as _limit_memory

__all__ = ["ScorerSpec", "IDLE", "PROGRESS_BYTES", "progress_view"]

IDLE = -1.0
PROGRESS_BYTES = 16  # two doubles: position in the chunk, start time
FLUSH_S = 0.2  # inside a long chunk, results go back at least this often


@dataclass(frozen=True)
class ScorerSpec:
    """Where a worker finds its scoring function: a ``.py`` file, or the built-in scorers when ``path`` is None.

    Attributes:
        path: file defining the function (``custom_reward_function.path``); ``None`` = ``default_compute_score``.
        name: function name in that file (``custom_reward_function.name``).
        reward_kwargs: keywords bound to every call (``functools.partial``).
        optional_kwargs: keywords bound only if a custom function takes them (``reward_model.reward_kwargs``,
            options of the built-in scorers); :meth:`unused_optional` names the others.
    """

    path: str | None = None
    name: str = "compute_score"
    reward_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optional_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def unused_optional(self, fn: Callable[..., Any]) -> list[str]:
        """Names in ``optional_kwargs`` the loaded custom function ``fn`` does not take (sorted)."""
        if self.path is None or not self.optional_kwargs:
            return []
        from verl.rewards.custom import split_accepted_kwargs

        inner = fn.func if isinstance(fn, functools.partial) else fn
        rest = {k: v for k, v in self.optional_kwargs.items() if k not in self.reward_kwargs}
        return split_accepted_kwargs(inner, rest)[1]

    def load(self) -> Callable[..., Any]:
        """Import the function in this process (see :func:`verl.rewards.custom.load_reward_function`).

        Raises:
            RewardFunctionLoadError: the file, function or signature is unusable.
        """
        if self.path is None:
            from verl.rewards.default import default_compute_score

            kwargs = {**self.optional_kwargs, **self.reward_kwargs}
            return functools.partial(default_compute_score, **kwargs) if kwargs else default_compute_score
        from verl.rewards.custom import load_reward_function

        return load_reward_function(self.path, self.name, dict(self.reward_kwargs), dict(self.optional_kwargs))


def progress_view(buffer: mmap.mmap) -> Any:
    """The shared ``(position, start)`` pair as a ctypes array (aligned 8-byte stores do not tear)."""
    return (ctypes.c_double * 2).from_buffer(buffer)


def _error_payload(exc: BaseException) -> tuple[bytes | None, str, str, str, bool]:
    """(pickled exception or None, class name, message, formatted traceback, is a RewardConfigError)."""
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # a class defined in the user's module would not unpickle in the trainer either
    except Exception:  # noqa: BLE001 - any failure means: send the message instead
        blob = None
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return blob, type(exc).__name__, str(exc), text, isinstance(exc, RewardConfigError)


def _send_results(conn: Connection, task_id: int, results: list, done: bool, retire: bool) -> None:
    kind = "done" if done else "part"
    try:
        conn.send((kind, task_id, results, retire))
    except (pickle.PicklingError, TypeError, AttributeError):
        # Some result cannot be pickled: report those samples as errors instead of losing the chunk.
        safe = []
        for pos, status, payload, elapsed in results:
            if status == "ok":
                try:
                    pickle.dumps(payload)
                except Exception as exc:  # noqa: BLE001 - the result's fault, whatever the pickling error
                    err = TypeError(f"result of type {type(payload).__name__} cannot be sent to the trainer: {exc}")
                    status, payload = "error", _error_payload(err)
            safe.append((pos, status, payload, elapsed))
        conn.send((kind, task_id, safe, retire))


def _score_chunk(conn: Connection, progress: Any, fn: Callable[..., Any], task_id: int, items: list) -> bool:
    """Score one chunk, sending results back; returns True when the worker must exit (after a MemoryError)."""
    results: list = []
    last_flush = time.monotonic()
    retire = False
    for pos, kwargs in enumerate(items):
        start = time.monotonic()
        progress[1] = start  # start first, then position: the parent re-reads the position to detect a race
        progress[0] = float(pos)
        try:
            value = fn(**kwargs)
            if inspect.isawaitable(value):  # `async def` reward functions are allowed (verl)
                value = asyncio.run(_await(value))
            results.append((pos, "ok", value, time.monotonic() - start))
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from a scorer are its failure
            results.append((pos, "error", _error_payload(exc), time.monotonic() - start))
            # After a MemoryError the heap may be fragmented or leaking: a fresh process is cheaper than doubt.
            retire = isinstance(exc, MemoryError)
        if retire:
            break
        if time.monotonic() - last_flush >= FLUSH_S and pos + 1 < len(items):
            _send_results(conn, task_id, results, done=False, retire=False)
            results, last_flush = [], time.monotonic()
    progress[0] = IDLE
    _send_results(conn, task_id, results, done=True, retire=retire)
    return retire


def main(conn_fd: int, progress_fd: int) -> int:
    """Worker loop; returns the exit status (0 when the pipe closes or ``None`` arrives)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    conn = Connection(conn_fd)
    progress = progress_view(mmap.mmap(progress_fd, PROGRESS_BYTES))
    spec, memory_limit_mb = conn.recv()
    try:
        _limit_memory(memory_limit_mb)
        fn = spec.load()
        unused = spec.unused_optional(fn)
    except BaseException as exc:  # noqa: BLE001 - report any import failure (MemoryError included) by message
        conn.send(("load_error", f"{type(exc).__name__}: {exc}"))
        return 1
    conn.send(("ready", unused))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return 0
        if message is None:
            return 0
        if _score_chunk(conn, progress, fn, *message):
            return 0
