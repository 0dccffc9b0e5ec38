"""``Worker``: the base class of everything a worker group runs, and its rank/world-size identity.

A worker learns who it is, in this order:

1. explicit keyword arguments to ``Worker.__init__`` (``rank=``, ``world_size=``, ...);
2. the identity an in-process group assigns while constructing it (:class:`LocalWorkerGroup`);
3. the environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
   ``MASTER_PORT`` (what ``torchrun`` and the Ray worker group set); absent variables mean a single
   process (rank 0 of 1).

Nothing here initialises ``torch.distributed``: the engines (or the Ray layer) do that with
``WorkerMeta.to_env()``-style settings and the platform's backend. Source: verl/single_controller/base/worker.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

_ENV_INT_DEFAULTS = {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1}


@dataclass(frozen=True)
class WorkerMeta:
    """Identity of one worker in its group.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of workers in the group (>= 1).
        local_rank / local_world_size: rank and worker count on this node.
        master_addr / master_port: rendezvous address for ``torch.distributed`` (``None`` if unset).

    Raises:
        ValueError: out-of-range values, naming the field and the fix.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None

    def __post_init__(self) -> None:
        for field in ("rank", "world_size", "local_rank", "local_world_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"WorkerMeta.{field} must be an int, got {type(value).__name__}")
        if self.world_size < 1:
            raise ValueError(f"WorkerMeta.world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"WorkerMeta.rank={self.rank} is outside [0, world_size={self.world_size}); check RANK/WORLD_SIZE"
            )
        if self.local_world_size < 1 or self.local_rank < 0:
            raise ValueError(
                f"WorkerMeta.local_rank={self.local_rank} / local_world_size={self.local_world_size} must be "
                ">= 0 / >= 1; check LOCAL_RANK/LOCAL_WORLD_SIZE"
            )
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ValueError(f"WorkerMeta.master_port={self.master_port} is not a TCP port (1..65535)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerMeta:
        """Read the identity from ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
        ``MASTER_PORT`` (default: ``os.environ``). Missing variables take single-process defaults.

        Raises:
            ValueError: a variable is not an integer, or the values are inconsistent (names the variable).
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var, default in (*_ENV_INT_DEFAULTS.items(), ("MASTER_PORT", None)):
            raw = env.get(var)
            if raw is None or raw == "":
                values[var] = default
                continue
            try:
                values[var] = int(raw)
            except ValueError:
                raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None
        return cls(
            rank=values["RANK"],
            world_size=values["WORLD_SIZE"],
            local_rank=values["LOCAL_RANK"],
            local_world_size=values["LOCAL_WORLD_SIZE"],
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=values["MASTER_PORT"],
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables describing this identity (``MASTER_*`` only when set)."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }
        if self.master_addr is not None:
            env["MASTER_ADDR"] = self.master_addr
        if self.master_port is not None:
            env["MASTER_PORT"] = str(self.master_port)
        return env


@dataclass(frozen=True)
class DistRankInfo:
    """A worker's coordinates in a parallel mesh (tensor, data, pipeline, context parallel ranks)."""

    tp_rank: int = 0
    dp_rank: int = 0
    pp_rank: int = 0
    cp_rank: int = 0


@dataclass(frozen=True)
class DistGlobalInfo:
    """Sizes of the parallel mesh; ``tp_size * dp_size * pp_size * cp_size`` workers in total."""

    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1


_ASSIGNED: contextvars.ContextVar[WorkerMeta | None] = contextvars.ContextVar("verl_worker_meta", default=None)


@contextlib.contextmanager
def assigned_identity(meta: WorkerMeta) -> Iterator[None]:
    """Within this block, every :class:`Worker` constructed (in this thread) takes ``meta`` as its identity.

    Used by in-process groups, which cannot pass ranks through the user's ``__init__`` signature.
    """
    token = _ASSIGNED.set(meta)
    try:
        yield
    finally:
        _ASSIGNED.reset(token)


class Worker:
    """Base class of worker classes run by a worker group.

    Subclasses add ``@register``-ed methods and call ``super().__init__()`` (optional: the identity is set
    in ``__new__``, before the subclass's ``__init__`` runs, so ``self.rank`` is usable there).

    Keyword arguments override the assigned or environment identity; ``rank`` and ``world_size`` are
    validated together (``ValueError`` if ``rank >= world_size``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        instance = super().__new__(cls)
        assigned = _ASSIGNED.get()
        instance._worker_meta = assigned if assigned is not None else WorkerMeta.from_env()
        return instance

    def __init__(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        local_world_size: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
    ) -> None:
        given = {
            "rank": rank,
            "world_size": world_size,
            "local_rank": local_rank,
            "local_world_size": local_world_size,
            "master_addr": master_addr,
            "master_port": master_port,
        }
        overrides = {key: value for key, value in given.items() if value is not None}
        if overrides:
            self._worker_meta = replace(self._worker_meta, **overrides)

    @property
    def meta(self) -> WorkerMeta:
        """This worker's full identity."""
        return self._worker_meta

    @property
    def rank(self) -> int:
        return self._worker_meta.rank

    @property
    def world_size(self) -> int:
        return self._worker_meta.world_size

    @property
    def local_rank(self) -> int:
        return self._worker_meta.local_rank

    @property
    def local_world_size(self) -> int:
        return self._worker_meta.local_world_size

    def get_master_addr_port(self) -> tuple[str | None, int | None]:
        """``(MASTER_ADDR, MASTER_PORT)`` of this worker's group, ``None`` where unset."""
        return self._worker_meta.master_addr, self._worker_meta.master_port

    # ---- mesh-aware dispatch (verl's ``_register_dispatch_collect_info``) ----------------------------------

    def register_dispatch_collect_info(self, mesh_name: str, *, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this worker's place in mesh ``mesh_name`` for :func:`~verl.controller.mesh_dispatch.make_nd_compute_dataproto_dispatch_fn`.

        Args:
            mesh_name: e.g. ``"rollout"``.
            dp_rank: which data chunk this worker gets (workers of one tensor-parallel group share one).
            dp_size: number of chunks the batch is split into (data-parallel replicas).
            is_collect: this worker's output is the one kept for its chunk (one per replica).

        Raises:
            ValueError: ``dp_rank`` outside ``[0, dp_size)``.
        """
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"mesh {mesh_name!r}: dp_rank {dp_rank} outside [0, dp_size={dp_size})")
        infos = self.__dict__.setdefault("_dispatch_collect_info", {})
        infos[mesh_name] = (int(dp_rank), int(dp_size), bool(is_collect))

    def query_dispatch_info(self, mesh_name: str) -> tuple[int, int, bool] | None:
        """``(dp_rank, dp_size, is_collect)`` registered for ``mesh_name``, or None (plain data parallel)."""
        return self.__dict__.get("_dispatch_collect_info", {}).get(mesh_name)
