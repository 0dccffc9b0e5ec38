"""``RayWorkerGroup``: one Ray actor per rank, driven through the shared :class:`WorkerGroup` protocol.

Each actor is the user's worker class under ``ray.remote``, placed in its bundle of the pool's placement
group (rank 0 first) with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in its runtime environment, so :class:`~verl.controller.Worker` reads its identity in
``__new__`` and ``torch.distributed.init_process_group(backend, init_method="env://")`` works in the
workers. ``MASTER_ADDR`` / ``MASTER_PORT`` are ``127.0.0.1`` (a group on one node) or rank 0's node IP (a group
spanning nodes) and a port free there, probed before
rank 0 starts (on the driver when rank 0 shares its node, else by a zero-resource task pinned to it).

The worker class travels to the actors with cloudpickle: by reference when its module is importable on
the workers, by value otherwise (``__main__``, generated colocated classes, or modules registered with
``ray.cloudpickle.register_pickle_by_value``). Source: verl/single_controller/ray/base.py (``RayWorkerGroup``).
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.controller.decorator import registered_methods
from verl.controller.errors import WorkerError
from verl.controller.ray.resource_pool import RayResourcePool
from verl.controller.worker import WorkerMeta
from verl.controller.worker_group import ClassWithInitArgs, WorkerGroup
from verl.platform.base import Platform
from verl.platform.network import free_port, listen_host, loopback_collective_env

#: After one rank failed, how long the other ranks get to finish so that every failing rank is reported
#: (a rank blocked in a collective with the failed one would otherwise never return).
ERROR_GRACE_S = 2.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerDiedError(RuntimeError):
    """The worker process of a rank is gone (crash, ``os._exit``, OOM kill, node loss); ``__cause__`` is Ray's error."""


@dataclass(frozen=True)
class _RayCall:
    """Handle of one submitted actor call."""

    ref: ray.ObjectRef
    rank: int
    method_name: str


def node_ip_and_free_port(spans_nodes: bool = True) -> tuple[str, int]:
    """Where a group's rank 0 hosts its rendezvous store on this node: ``(address, port free there now)``.

    The address is this node's IP as Ray sees it when the group spans nodes, else ``127.0.0.1``
    (:func:`verl.platform.network.listen_host`): a group on one node listens on loopback only.
    """
    host = listen_host(spans_nodes, ray.util.get_node_ip_address())
    return host, free_port(host)


def placement_nodes(pgs: Sequence[PlacementGroup]) -> frozenset[str]:
    """Ray node ids that hold a bundle of any of ``pgs``."""
    return frozenset(node for pg in pgs for node in placement_group_table(pg)["bundles_to_node_id"].values())


def rendezvous_address(pgs: Sequence[PlacementGroup], *, force_remote: bool = False) -> tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)`` for a group whose rank 0 sits in bundle 0 of ``pgs[0]``.

    ``127.0.0.1`` when all of ``pgs``' bundles are on one node, else that node's IP; the port is probed on
    the driver when that bundle is on the driver's node (unless ``force_remote``), otherwise by a zero-resource
    task pinned to the bundle's node. The port is free when probed; like torchrun's, it could be taken by another
    process before rank 0 binds it.
    """
    spans_nodes = len(placement_nodes(pgs)) > 1
    node_id = placement_group_table(pgs[0])["bundles_to_node_id"][0]
    if not force_remote and node_id == ray.get_runtime_context().get_node_id():
        return node_ip_and_free_port(spans_nodes)
    probe = ray.remote(num_cpus=0)(node_ip_and_free_port)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.get(probe.options(scheduling_strategy=strategy).remote(spans_nodes), timeout=120)


def one_node_cluster() -> bool:
    """Whether the Ray cluster has exactly one live node (then no group of the run can leave it)."""
    return sum(1 for node in ray.nodes() if node.get("Alive")) == 1


class RayWorkerGroup(WorkerGroup):
    """``resource_pool.world_size`` Ray actors of ``cls_with_init.cls`` with the driver-side API of the class.

    Args:
        resource_pool: where the actors go; its placement groups are created now if no group made them yet.
        cls_with_init: the worker class and its constructor arguments (every rank gets the same ones).
        name_prefix: prefix of the actor names (``{prefix}_{Class}_{rank}``); default: random, unique.
        platform: must match the pool's device resource if given (the pool's platform is used).
        init_timeout_s: how long to wait for every actor's constructor (``None``: forever).

    Results, dispatch and errors match :class:`~verl.controller.LocalWorkerGroup`; calls on different
    ranks run in parallel, calls on one (synchronous) actor run in submission order.

    Known differences from the in-process group: arguments and results are serialised (a worker cannot
    mutate the driver's objects); a constructor failure is reported with a :class:`WorkerDiedError` cause
    (Ray keeps only its text); a class with ``async def`` methods becomes a Ray async actor, whose calls
    may interleave; on GPU nodes Ray sets ``CUDA_VISIBLE_DEVICES`` to the actor's device, so a worker
    should use device 0 of what it sees rather than ``LOCAL_RANK``.

    Raises:
        TypeError: wrong argument types. ValueError: ``platform`` uses another resource than the pool, or
        the pool already hosts ``max_colocate_count`` groups. PlacementError: the pool cannot be placed.
        WorkerError: a constructor raised or its process died (method ``__init__``).
        TimeoutError: constructors did not finish within ``init_timeout_s``.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        cls_with_init: ClassWithInitArgs,
        *,
        name_prefix: str | None = None,
        platform: Platform | None = None,
        init_timeout_s: float | None = 300.0,
    ) -> None:
        super().__init__()
        if not isinstance(resource_pool, RayResourcePool):
            raise TypeError(f"RayWorkerGroup needs a RayResourcePool, got {type(resource_pool).__name__}")
        if not isinstance(cls_with_init, ClassWithInitArgs):
            raise TypeError(
                f"RayWorkerGroup needs a ClassWithInitArgs, got {type(cls_with_init).__name__}; "
                "wrap the class: RayWorkerGroup(pool, ClassWithInitArgs(MyWorker, *init_args))"
            )
        if resource_pool._users >= resource_pool.max_colocate_count:
            raise ValueError(
                f"{resource_pool!r} already hosts {resource_pool._users} worker group(s), its max_colocate_count; "
                "shut one down, build the pool with a larger max_colocate_count, or colocate the roles in one "
                "group (create_colocated_worker_cls)"
            )
        if platform is not None and platform.ray_resource_name != resource_pool.resource_name:
            raise ValueError(
                f"platform {platform.name!r} reserves {platform.ray_resource_name!r} but the pool reserves "
                f"{resource_pool.resource_name!r}; build the pool with platform={platform.name!r}"
            )
        self.worker_cls = cls_with_init.cls
        self.platform = resource_pool.platform
        self._pool = resource_pool
        self._world_size = resource_pool.world_size
        self.name_prefix = name_prefix or f"verl_{uuid.uuid4().hex[:6]}"
        self._actors: list[Any] | None = None
        pgs = resource_pool._acquire()
        self._actors = []
        try:
            self.master_addr, self.master_port = rendezvous_address(pgs)
            self.node_ids = placement_nodes(pgs)
            # On a one-node cluster every group stays on the node: Gloo's and NCCL's own sockets use loopback.
            network_env = loopback_collective_env(nccl=True) if one_node_cluster() else {}
            remote_cls = ray.remote(self.worker_cls)
            for rank, (node, bundle_index, local_rank, local_world_size) in enumerate(resource_pool.layout()):
                meta = WorkerMeta(
                    rank=rank,
                    world_size=self._world_size,
                    local_rank=local_rank,
                    local_world_size=local_world_size,
                    master_addr=self.master_addr,
                    master_port=self.master_port,
                )
                options = dict(
                    resource_pool.actor_options(),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pgs[node], bundle_index),
                    runtime_env={"env_vars": {**network_env, **meta.to_env()}},
                    name=f"{self.name_prefix}_{self.worker_cls.__name__}_{rank}",
                )
                actor = remote_cls.options(**options).remote(*cls_with_init.args, **cls_with_init.kwargs)
                self._actors.append(actor)
            ready = [_RayCall(a.__ray_ready__.remote(), rank, "__init__") for rank, a in enumerate(self._actors)]
            self._wait(ready, init_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        self._bind_worker_methods(registered_methods(self.worker_cls))

    # ---- backend primitives ------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def workers(self) -> list[Any]:
        """The actor handles in rank order (empty after :meth:`shutdown`)."""
        return list(self._actors or ())

    @property
    def resource_pool(self) -> RayResourcePool:
        return self._pool

    def _submit(self, rank: int, method_name: str, args: tuple, kwargs: dict) -> _RayCall:
        if not self._actors:
            raise RuntimeError(f"{self!r} was shut down; build a new RayWorkerGroup")
        if not 0 <= rank < self._world_size:
            raise IndexError(f"rank {rank} is outside this group's world size {self._world_size}")
        if not callable(getattr(self.worker_cls, method_name, None)):
            raise AttributeError(
                f"{self.worker_class_name} has no method {method_name!r}; "
                f"registered methods: {', '.join(self.method_names) or 'none'}"
            )
        return _RayCall(getattr(self._actors[rank], method_name).remote(*args, **kwargs), rank, method_name)

    def _wait(self, handles: Sequence[_RayCall], timeout: float | None = None) -> list:
        """Values of ``handles`` in order.

        Raises:
            WorkerError: for the lowest rank whose process died, else the lowest failing rank
                (``failed_ranks`` lists every rank seen failing; the
                other ranks get :data:`ERROR_GRACE_S` to finish first). ``__cause__`` is the worker's own
                exception (remote traceback attached as a note) or a :class:`WorkerDiedError`.
            TimeoutError: not all finished within ``timeout`` seconds (names the method and pending ranks);
                waiting again is allowed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        by_ref = {h.ref: i for i, h in enumerate(handles)}
        values: list[Any] = [None] * len(handles)
        errors: dict[int, tuple[BaseException, BaseException]] = {}
        pending = [h.ref for h in handles]
        while pending:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            if not ready:
                if errors:
                    break
                ranks = sorted(handles[by_ref[r]].rank for r in pending)
                raise TimeoutError(
                    f"{self.worker_class_name}.{handles[0].method_name} did not finish within {timeout:g} s "
                    f"on ranks {ranks}; wait again or raise the timeout"
                )
            for ref in ready:
                i = by_ref[ref]
                try:
                    values[i] = ray.get(ref)
                except RayError as err:
                    if not errors:  # first failure: the other ranks get a short grace, then it is reported
                        grace_end = time.monotonic() + ERROR_GRACE_S
                        deadline = grace_end if deadline is None else min(deadline, grace_end)
                    errors[i] = self._map_error(handles[i], err)
        if errors:
            # A dead worker is the root cause: the survivors' collectives then fail with "connection reset"
            # errors, so it is reported first (lowest dead rank), else the lowest failing rank.
            first = min(errors, key=lambda i: (not isinstance(errors[i][0], WorkerDiedError), handles[i].rank))
            cause, chained = errors[first]
            failed = tuple(sorted(handles[i].rank for i in errors))
            error = WorkerError(
                self.worker_class_name,
                handles[first].rank,
                handles[first].method_name,
                cause,
                world_size=self._world_size,
                failed_ranks=failed,
            )
            raise error from chained
        return values

    def _map_error(self, call: _RayCall, err: RayError) -> tuple[BaseException, BaseException]:
        """``(cause, chained)``: the exception to report and the one to chain as ``__cause__``."""
        if isinstance(err, RayTaskError):
            cause = err.cause if isinstance(err.cause, BaseException) else err
            if cause is not err and hasattr(cause, "add_note"):  # Python >= 3.11: show where it happened
                cause.add_note(f"Raised on rank {call.rank} ({call.method_name}); Ray's report:\n{err}")
            return cause, cause
        if isinstance(err, RayActorError):
            lines = [line.strip() for line in _ANSI.sub("", str(err)).splitlines() if line.strip()]
            if err.actor_init_failed:  # Ray's report ends with the constructor's "ExcType: message" line
                what = f"its constructor raised {lines[-1] if lines else 'an exception'}"
            else:
                what = "the process exited or was killed; Ray: " + (lines[0] if lines else type(err).__name__)
            died = WorkerDiedError(
                f"the worker process of {self.worker_class_name} rank {call.rank} died while running "
                f"{call.method_name} ({what.rstrip('.')}); its actor is gone, so shut this group down and build a "
                "new one"
            )
            died.__cause__ = err
            return died, died
        return err, err

    def _done(self, handles: Sequence[_RayCall]) -> bool:
        refs = [h.ref for h in handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(ready) == len(refs)

    # ---- lifecycle -----------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Kill the actors and release the pool (its placement groups go when no group uses them). Idempotent."""
        actors, self._actors = self._actors, None
        if actors is None:
            return
        for actor in actors:
            with contextlib.suppress(Exception):  # an actor that is already gone needs no kill
                ray.kill(actor, no_restart=True)
        self._pool._release()

    def __enter__(self) -> RayWorkerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "" if self._actors else " (shut down)"
        return f"<RayWorkerGroup {self.worker_class_name} world_size={self._world_size}{state}>"
