"""Errors raised by the single-controller layer.

Both the in-process :class:`~verl.controller.local.LocalWorkerGroup` and the Ray worker group raise
these, so driver code handles a failing worker the same way whichever backend runs it.
"""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker method raised (or the worker process died) while the group executed it.

    The original exception is chained as ``__cause__`` so its traceback stays visible.

    Attributes:
        worker_class: name of the worker class (for colocated workers, the colocated class).
        rank: rank of the failing worker in its group.
        method_name: name of the method called on the worker.
        world_size: size of the group, or ``None`` when unknown.
        failed_ranks: every rank of this call that failed, in rank order (``rank`` is the first).
        summary: the message without its last sentence (which points at the chained traceback).
    """

    def __init__(
        self,
        worker_class: str,
        rank: int,
        method_name: str,
        cause: BaseException,
        *,
        world_size: int | None = None,
        failed_ranks: tuple[int, ...] = (),
    ) -> None:
        self.worker_class = worker_class
        self.rank = rank
        self.method_name = method_name
        self.world_size = world_size
        self.failed_ranks = failed_ranks or (rank,)
        where = f"rank {rank}" if world_size is None else f"rank {rank} of world size {world_size}"
        others = [r for r in self.failed_ranks if r != rank]
        also = f" (ranks {others} failed as well)" if others else ""
        reason = str(cause).rstrip().rstrip(".")
        #: The message without the pointer to the chained traceback (for a CLI that prints errors plainly).
        self.summary = f"{worker_class}.{method_name} failed on {where}{also}: {type(cause).__name__}: {reason}."
        super().__init__(f"{self.summary} The worker's traceback is chained below.")
        self.__cause__ = cause


class PlacementError(RuntimeError):
    """A Ray resource pool cannot be placed: it never fits the cluster, or did not fit within the timeout
    (the message names the requested bundles, what the cluster has, and the fix)."""


class DispatchError(ValueError):
    """Arguments or results do not fit the method's dispatch mode (wrong lengths, wrong types)."""
