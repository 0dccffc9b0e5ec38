"""Clean stops: Ctrl-C (SIGINT) and SIGTERM end a run between two consistent states, never inside a checkpoint.

:class:`StopSignals` turns both signals into :class:`StopRequested` (a ``KeyboardInterrupt``) raised in the main
thread, so ``finally`` blocks run, the loggers close and the workers shut down. While the trainer *holds* the stop
(from the start of a checkpoint save until that step's row is logged), a signal is only recorded: the save
completes, the row is written, and the stop is raised when the hold ends. A second signal during a hold stops at
once; the checkpoint being written is then abandoned and its temp folder removed by the save itself (the
checkpoint protocol cleans up on any exception), so the last complete checkpoint stays the one a rerun resumes.

``verl train`` turns :class:`StopRequested` into the line ``stopped at step N; rerun to resume ...`` and the shell's
exit status for a signal, ``128 + signum``: 130 for SIGINT, 143 for SIGTERM.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["SIGNALS", "StopRequested", "StopSignals", "exit_status"]

#: The signals that stop a run cleanly.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """The shell's status for a process ended by ``signum``: ``128 + signum`` (SIGINT 130, SIGTERM 143)."""
    return 128 + int(signum)


class StopRequested(KeyboardInterrupt):
    """A stop signal arrived; raised in the main thread by :class:`StopSignals`.

    A ``KeyboardInterrupt``, so ``except Exception`` handlers do not swallow it. Attributes: ``signum`` (int) and
    ``signame`` (``"SIGINT"``, ``"SIGTERM"``).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(self.signame)

    @property
    def signame(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def __reduce__(self):
        return (type(self), (self.signum,))


class StopSignals:
    """SIGINT/SIGTERM handlers that raise :class:`StopRequested`, deferred while a stop is held.

    Not installed, it changes nothing: :meth:`hold` / :meth:`release` are then plain bookkeeping and Python's own
    handlers act. Only the main thread can install it (Python runs signal handlers there).
    """

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._held: str | None = None
        self._pending: int | None = None

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> bool:
        """Set the handlers (again: a library such as Ray may have replaced the SIGTERM one); returns False when
        not called from the main thread (nothing is installed). The handlers found first are kept for
        :meth:`restore`."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)
        return True

    def restore(self) -> None:
        """Put back the handlers found by the first :meth:`install` (idempotent)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, signum: int, frame: Any) -> None:
        if self._held is not None and self._pending is None:
            self._pending = signum
            name = signal.Signals(signum).name
            # os.write, not print: the main thread may be inside a print to the same stream (re-entry error).
            message = f"verl train: {name} received; stopping once {self._held} (send it again to stop at once)\n"
            os.write(2, message.encode())
            return
        raise StopRequested(signum)

    def hold(self, what: str) -> None:
        """Defer stops until :meth:`release`; ``what`` finishes the sentence "stopping once ..." shown on a signal."""
        self._held = what

    def release(self) -> None:
        """End the hold; raise the :class:`StopRequested` of a signal that arrived during it, if any."""
        pending = self._pending
        self._held = self._pending = None
        if pending is not None:
            raise StopRequested(pending)

    def discard(self) -> None:
        """End the hold and forget a signal that arrived during it (the caller stops anyway)."""
        self._held = self._pending = None

    @contextmanager
    def step(self) -> Iterator[None]:
        """Scope of a hold taken inside (:meth:`hold`): it ends with the block; a deferred stop is raised then,
        unless the block raised (that error goes on, the stop is dropped: the run ends either way)."""
        try:
            yield
        except BaseException:
            self.discard()
            raise
        self.release()
