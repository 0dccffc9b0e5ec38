"""Run a scoring function in a pool of worker processes: per-sample timeout, memory limit, crash recovery.

Why a pool of our own rather than ``concurrent.futures.ProcessPoolExecutor``: the executor cannot kill one hung
task (a hang keeps its worker forever), a worker that dies breaks the whole executor (every pending future fails),
and its spawn/forkserver children re-import the trainer's ``__main__``. Here every worker is a fresh interpreter
started with ``subprocess`` (:mod:`verl.rewards._procmain` running :mod:`verl.rewards._procworker`: never a fork of a trainer that holds torch threads and
locks) with its own socket, so a hung worker is killed and a dead one replaced without touching the others, and the
trainer never waits longer than ``timeout_s`` on any sample.

Protocol: the scorer is described by a picklable :class:`ScorerSpec` (file path + function name + keywords), and
each worker imports it **once**, at start, by path (functions are never pickled). Samples go out in chunks (one
message per chunk, so the per-sample overhead is small) and results come back per chunk, or every ``FLUSH_S``
seconds inside a long chunk. Each worker publishes in shared memory which sample of its chunk it is running and
since when, so the parent knows exactly which sample timed out or crashed: that one is reported, the rest of its
chunk is rescheduled on the other workers.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from verl.rewards._pool import Outcome
from verl.rewards._procworker import IDLE, PROGRESS_BYTES, ScorerSpec, progress_view
from verl.rewards.errors import RewardConfigError, RewardFunctionLoadError, ScorerProcessDied, ScorerRaised

__all__ = ["ScorerSpec", "ScorerProcessPool"]

_MAX_CHUNK = 64
_START_TIMEOUT_S = 120.0  # a worker that cannot import its scorer in this time is a load failure


class _Worker:
    """One worker process, its socket and its shared progress pair."""

    def __init__(self, spec: ScorerSpec, memory_limit_mb: int | None) -> None:
        parent_sock, child_sock = socket.socketpair()
        with tempfile.TemporaryFile() as shared:
            shared.write(b"\0" * PROGRESS_BYTES)
            shared.flush()
            self._map = mmap.mmap(shared.fileno(), PROGRESS_BYTES)
            self.progress = progress_view(self._map)
            self.progress[0] = IDLE
            # The trainer's import path, so the worker resolves `verl` and the user's imports the same way.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "verl.rewards._procmain", str(child_sock.fileno()), str(shared.fileno())],
                    pass_fds=(child_sock.fileno(), shared.fileno()),
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,  # its own process group: a kill also reaches the scorer's children
                )
            finally:
                child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send((spec, memory_limit_mb))
        self.started = time.monotonic()
        self.ready = False
        self.task: tuple[int, list[int], set[int]] | None = None  # (task id, sample indices, reported positions)

    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        # The whole group: a scorer that started helpers (a compiler, a sandbox, `sleep`) loses them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        _reap(self.process, 5)
        self.conn.close()
        del self.progress
        self._map.close()

    def running(self) -> tuple[int, float] | None:
        """(position in the chunk, start time) of the sample being scored, or None when idle."""
        pos, start = self.progress[0], self.progress[1]
        if pos == IDLE or self.progress[0] != pos:
            return None
        return int(pos), start


class ScorerProcessPool:
    """``num_workers`` spawn-context processes that each import ``spec`` once and score chunks of samples.

    Args:
        spec: the scoring function, by path.
        num_workers: processes (>= 1), started (and their scorer imported) in the constructor.
        memory_limit_mb: address-space limit per worker (``RLIMIT_AS``, MiB); ``None`` = no limit. An allocation
            beyond it raises ``MemoryError`` inside the scorer (or kills the worker, if it happens in C code).

    Raises:
        RewardFunctionLoadError: a worker could not import the scorer (message from the worker), or died or did not
            report within ``_START_TIMEOUT_S`` while importing it.
        ValueError: invalid ``num_workers`` or ``memory_limit_mb``.
    """

    def __init__(self, spec: ScorerSpec, num_workers: int, memory_limit_mb: int | None = 2048) -> None:
        if int(num_workers) < 1:
            raise ValueError(f"num_workers={num_workers!r} must be >= 1")
        if memory_limit_mb is not None and int(memory_limit_mb) <= 0:
            raise ValueError(f"reward_model.memory_limit_mb={memory_limit_mb!r} must be > 0 MiB, or null for no limit")
        self.spec = spec
        self.num_workers = int(num_workers)
        self.memory_limit_mb = None if memory_limit_mb is None else int(memory_limit_mb)
        self._task_ids = 0
        self.restarts = 0  # workers replaced after a crash, timeout or MemoryError, over the pool's life
        self.unused_optional_kwargs: list[str] = []  # spec.optional_kwargs the loaded function does not take
        self._workers: list[_Worker] = [self._start() for _ in range(self.num_workers)]
        try:
            for worker in self._workers:
                self._await_ready(worker)
        except BaseException:
            self.close()
            raise

    def _start(self) -> _Worker:
        return _Worker(self.spec, self.memory_limit_mb)

    def _await_ready(self, worker: _Worker) -> None:
        remaining = _START_TIMEOUT_S - (time.monotonic() - worker.started)
        if not worker.conn.poll(max(0.0, remaining)):
            raise RewardFunctionLoadError(
                f"reward worker did not load {self._where()} within {_START_TIMEOUT_S:.0f}s "
                f"({_describe_exit(worker.exitcode)})"
            )
        self._on_ready_message(worker)

    def _on_ready_message(self, worker: _Worker) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            _reap(worker.process, 5)
            raise RewardFunctionLoadError(
                f"reward worker died while importing {self._where()} ({_describe_exit(worker.exitcode)}); "
                f"memory_limit_mb={self.memory_limit_mb} may be too low for what the module imports"
            ) from None
        if message[0] == "load_error":
            raise RewardFunctionLoadError(f"reward worker could not load {self._where()}: {message[1]}")
        self.unused_optional_kwargs = list(message[1] or [])
        worker.ready = True

    def _where(self) -> str:
        if self.spec.path is None:
            return "the built-in scorers (verl.rewards.default_compute_score)"
        return f"{self.spec.name!r} from custom_reward_function.path={self.spec.path!r}"

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._start()
        self.restarts += 1

    # ------------------------------------------------------------------------------------------- scoring
    def map(
        self,
        items: list[dict[str, Any]],
        *,
        timeout_s: float | None,
        should_stop: Callable[[Outcome], bool] = lambda outcome: False,
    ) -> list[Outcome | None]:
        """Score ``items`` (keyword dicts for the scorer); one :class:`Outcome` per item, in order.

        A sample running longer than ``timeout_s`` (``None`` = no limit) gets ``timed_out=True`` and its worker is
        killed and replaced; a sample whose worker dies gets ``error=ScorerProcessDied``; the rest of such a chunk
        is rescheduled. When ``should_stop(outcome)`` is true the call returns at once: busy workers are replaced
        and unfinished entries stay ``None``.

        Raises:
            RewardFunctionLoadError: a replacement worker could not import the scorer.
        """
        n = len(items)
        outcomes: list[Outcome | None] = [None] * n
        if n == 0:
            return outcomes
        size = max(1, min(_MAX_CHUNK, math.ceil(n / (4 * self.num_workers))))
        pending: deque[list[int]] = deque(list(range(i, min(i + size, n))) for i in range(0, n, size))
        resolved = 0
        try:
            while resolved < n:
                self._dispatch(pending, items)
                resolved_now, stop = self._collect(outcomes, pending, timeout_s, should_stop)
                resolved += resolved_now
                if stop:
                    break
        finally:
            for worker in list(self._workers):
                if worker.task is not None:  # stopped early (or interrupted): its work is stale
                    self._replace(worker)
        return outcomes

    def _dispatch(self, pending: deque[list[int]], items: list[dict[str, Any]]) -> None:
        for worker in self._workers:
            if not pending:
                return
            if not worker.ready or worker.task is not None:
                continue
            chunk = pending.popleft()
            self._task_ids += 1
            try:
                worker.conn.send((self._task_ids, [items[i] for i in chunk]))
            except (BrokenPipeError, EOFError, OSError):
                pending.appendleft(chunk)  # died while idle: nothing of the chunk ran
                self._replace(worker)
                continue
            worker.task = (self._task_ids, chunk, set())

    def _collect(self, outcomes, pending, timeout_s, should_stop) -> tuple[int, bool]:
        """Wait for the next message, exit or deadline; returns (samples resolved, stop requested)."""
        now = time.monotonic()
        deadlines = []
        for worker in self._workers:
            state = worker.running() if worker.task is not None else None
            if timeout_s is not None and state is not None:
                deadlines.append(state[1] + timeout_s)
            elif timeout_s is not None and worker.task is not None:
                deadlines.append(now + 0.05)  # dispatched but not started yet: look again soon for its start time
            if not worker.ready:
                deadlines.append(worker.started + _START_TIMEOUT_S)
        wait_s = max(0.0, min(deadlines) - now) if deadlines else None
        handles = {}
        for worker in self._workers:
            if worker.task is not None or not worker.ready:
                handles[worker.conn] = worker  # a dead worker's socket reads EOF: no separate sentinel
        if not handles:
            raise RuntimeError("reward pool has pending samples but no busy or starting worker (internal error)")
        wait(list(handles), timeout=wait_s)
        resolved, stop = 0, False
        for worker in list(self._workers):
            if not worker.ready:
                if worker.conn.poll():
                    self._on_ready_message(worker)
                elif not worker.alive() or time.monotonic() - worker.started > _START_TIMEOUT_S:
                    self._await_ready(worker)  # raises the load error with the exit code
                continue
            if worker.task is None:
                continue
            got, stop_now = self._drain(worker, outcomes, pending, should_stop)
            resolved += got
            stop = stop or stop_now
            if worker.task is not None and not stop:
                got, stop_now = self._check_stuck(worker, outcomes, pending, timeout_s, should_stop)
                resolved += got
                stop = stop or stop_now
        return resolved, stop

    def _drain(self, worker: _Worker, outcomes, pending, should_stop) -> tuple[int, bool]:
        """Read every result the worker has sent; (samples resolved, stop requested)."""
        resolved, stop = 0, False
        task_id, chunk, reported = worker.task
        try:
            while worker.conn.poll():
                kind, got_id, results, retire = worker.conn.recv()
                if got_id != task_id:
                    continue
                for pos, status, payload, elapsed in results:
                    reported.add(pos)
                    outcome = _to_outcome(status, payload, elapsed)
                    outcomes[chunk[pos]] = outcome
                    resolved += 1
                    stop = stop or should_stop(outcome)
                if kind == "done":
                    worker.task = None
                    if retire:
                        # The worker exits after a MemoryError; what it did not attempt goes back in the queue.
                        self._requeue_rest(chunk, reported, None, pending)
                        self._replace(worker)
                    return resolved, stop
        except (EOFError, OSError):
            pass  # died: _check_stuck attributes the crash
        return resolved, stop

    def _check_stuck(self, worker, outcomes, pending, timeout_s, should_stop) -> tuple[int, bool]:
        """Handle a worker that died or overran ``timeout_s`` on its current sample."""
        task_id, chunk, reported = worker.task
        state = worker.running()
        alive = worker.alive()
        if not alive:
            _reap(worker.process, 5)
        now = time.monotonic()
        if alive and (timeout_s is None or state is None or now - state[1] < timeout_s):
            return 0, False
        if alive:
            pos, start = state
            outcome = Outcome(timed_out=True, elapsed_s=now - start)
        else:
            pos = state[0] if state is not None else min(set(range(len(chunk))) - reported, default=None)
            detail = _describe_exit(worker.exitcode)
            outcome = Outcome(error=ScorerProcessDied(f"reward worker process died ({detail})"))
        worker.task = None
        self._replace(worker)
        resolved = 0
        if pos is not None and pos not in reported:
            reported.add(pos)
            outcomes[chunk[pos]] = outcome
            resolved = 1
        self._requeue_rest(chunk, reported, pos, pending)
        return resolved, resolved == 1 and should_stop(outcome)

    @staticmethod
    def _requeue_rest(chunk: list[int], reported: set[int], culprit: int | None, pending: deque[list[int]]) -> None:
        rest = [index for pos, index in enumerate(chunk) if pos not in reported and pos != culprit]
        if rest:
            pending.appendleft(rest)

    def close(self) -> None:
        """Stop every worker (a polite message, then SIGKILL for any that does not exit within a second)."""
        for worker in self._workers:
            try:
                if worker.task is None and worker.ready:
                    worker.conn.send(None)
            except (BrokenPipeError, EOFError, OSError):
                pass  # already dead: the SIGKILL below reaps it anyway
        deadline = time.monotonic() + 1.0
        for worker in self._workers:
            _reap(worker.process, max(0.0, deadline - time.monotonic()))
            worker.kill()
        self._workers = []

    def __del__(self) -> None:  # the trainer may not call close(); daemon workers would also die at exit
        with contextlib.suppress(Exception):  # interpreter shutdown: modules may already be gone
            self.close()


def _to_outcome(status: str, payload: Any, elapsed: float) -> Outcome:
    if status == "ok":
        return Outcome(value=payload, elapsed_s=elapsed)
    blob, type_name, message, text, is_config_error = payload
    error: BaseException | None = None
    if blob is not None:
        try:
            error = pickle.loads(blob)
        except Exception:  # noqa: BLE001 - fall back to the message
            error = None
    if error is None:
        error = RewardConfigError(message) if is_config_error else ScorerRaised(type_name, message)
    error.remote_traceback = text  # type: ignore[attr-defined]
    return Outcome(error=error, elapsed_s=elapsed)


def _reap(process: subprocess.Popen, timeout: float) -> None:
    """Wait for a killed or exiting worker; one stuck in uninterruptible sleep is left to the OS."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
