"""``RayResourcePool``: the placement groups a Ray worker group's actors live in.

One placement group per node entry, ``STRICT_PACK`` (all of a node's bundles on one machine), one bundle
per worker. A pool is shared by every group built on it (``max_colocate_count`` groups may place an actor
in the same bundle, as verl's colocated-but-separate groups do); the placement groups are created when
the first group needs them and removed when the last group using them shuts down.
Source: verl/single_controller/ray/base.py (``RayResourcePool``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from verl.controller.errors import PlacementError
from verl.platform.base import Platform


def _default_platform(platform: Platform | str | None) -> Platform:
    if platform is None:
        from verl.platform.cpu import CpuPlatform

        return CpuPlatform()
    if isinstance(platform, str):
        from verl.plugins import resolve_platform

        return resolve_platform(platform)
    if not isinstance(platform, Platform):
        raise TypeError(f"platform must be a verl Platform, a platform name or None, got {type(platform).__name__}")
    return platform


class RayResourcePool:
    """Workers per node, and the placement groups that reserve their resources.

    Args:
        process_on_nodes: number of workers on each node, e.g. ``[8, 8]`` (two nodes of 8); world size is
            the sum. Rank order follows the list: node 0's workers are ranks ``0..n0-1``, and so on.
        platform: device platform (``Platform``, its name, or ``None`` for the CPU platform); its
            ``ray_resource_name`` ("CPU", "GPU", "NPU") is the resource each worker reserves.
        cpus_per_worker: CPUs reserved per worker (> 0).
        max_colocate_count: how many worker groups may place an actor in each bundle (>= 1); a bundle holds
            ``cpus_per_worker * max_colocate_count`` CPUs and one accelerator, each actor takes
            ``cpus_per_worker`` CPUs and ``1 / max_colocate_count`` of the accelerator.
        name_prefix: prefix of the placement group names.
        placement_timeout_s: how long to wait for the cluster to place the groups (> 0).

    Raises:
        ValueError: an empty ``process_on_nodes``, a count < 1, ``cpus_per_worker <= 0``,
            ``max_colocate_count < 1`` or a timeout <= 0. TypeError: non-integer counts.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int],
        *,
        platform: Platform | str | None = None,
        cpus_per_worker: float = 1.0,
        max_colocate_count: int = 1,
        name_prefix: str = "verl",
        placement_timeout_s: float = 120.0,
    ) -> None:
        counts = list(process_on_nodes)
        if not counts:
            raise ValueError("RayResourcePool(process_on_nodes=...) needs at least one node, e.g. [2]")
        for i, count in enumerate(counts):
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"process_on_nodes[{i}] must be an int, got {type(count).__name__}")
            if count < 1:
                raise ValueError(f"process_on_nodes[{i}]={count}: every node needs at least one worker")
        if not cpus_per_worker > 0:
            raise ValueError(f"cpus_per_worker must be > 0, got {cpus_per_worker!r}")
        if isinstance(max_colocate_count, bool) or not isinstance(max_colocate_count, int) or max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be an int >= 1, got {max_colocate_count!r}")
        if not placement_timeout_s > 0:
            raise ValueError(f"placement_timeout_s must be > 0, got {placement_timeout_s!r}")
        self.process_on_nodes = counts
        self.platform = _default_platform(platform)
        self.cpus_per_worker = float(cpus_per_worker)
        self.max_colocate_count = max_colocate_count
        self.name_prefix = name_prefix
        self.placement_timeout_s = float(placement_timeout_s)
        self._pgs: list[PlacementGroup] | None = None
        self._users = 0

    @property
    def world_size(self) -> int:
        """Total number of workers (sum of ``process_on_nodes``)."""
        return sum(self.process_on_nodes)

    @property
    def resource_name(self) -> str:
        """Ray resource of one worker's device ("CPU", "GPU", "NPU")."""
        return self.platform.ray_resource_name

    def bundle(self) -> dict[str, float]:
        """Resources of one bundle (one worker slot): ``{"CPU": c}`` or ``{"GPU": 1, "CPU": c}``."""
        cpus = self.cpus_per_worker * self.max_colocate_count
        if self.resource_name == "CPU":
            return {"CPU": cpus}
        return {self.resource_name: 1.0, "CPU": cpus}

    def actor_options(self) -> dict[str, Any]:
        """``ray.remote(...).options`` resources of one actor of one group placed in a bundle."""
        options: dict[str, Any] = {"num_cpus": self.cpus_per_worker}
        share = 1.0 / self.max_colocate_count
        if self.resource_name == "GPU":
            options["num_gpus"] = share
        elif self.resource_name != "CPU":
            options["resources"] = {self.resource_name: share}
        return options

    def layout(self) -> list[tuple[int, int, int, int]]:
        """``(node_index, bundle_index, local_rank, local_world_size)`` for each rank, in rank order."""
        return [(node, j, j, count) for node, count in enumerate(self.process_on_nodes) for j in range(count)]

    def get_placement_groups(self, timeout_s: float | None = None) -> list[PlacementGroup]:
        """The pool's placement groups (one per node), created and waited for on first use.

        Raises:
            PlacementError: not placed within ``timeout_s`` (default ``placement_timeout_s``) seconds;
                names the requested bundles and the cluster's available and total resources. Nothing
                stays reserved after the error.
        """
        if self._pgs is not None:
            return list(self._pgs)
        self._check_fits()
        timeout = self.placement_timeout_s if timeout_s is None else float(timeout_s)
        token = uuid.uuid4().hex[:8]
        bundle = self.bundle()
        pgs = [
            placement_group(
                [dict(bundle) for _ in range(count)], strategy="STRICT_PACK", name=f"{self.name_prefix}_{token}_node{i}"
            )
            for i, count in enumerate(self.process_on_nodes)
        ]
        deadline = time.monotonic() + timeout
        unplaced = [i for i, pg in enumerate(pgs) if not pg.wait(max(deadline - time.monotonic(), 0.001))]
        if unplaced:
            for pg in pgs:
                remove_placement_group(pg)
            raise PlacementError(self._placement_message(unplaced, timeout))
        self._pgs = pgs
        return list(pgs)

    def _check_fits(self) -> None:
        """Fail at once (instead of after the timeout) when some node entry needs more than any machine of the
        cluster has in total: such a placement group can never be placed.

        Raises:
            PlacementError: naming the entry, the largest machine and the fix.
        """
        largest: dict[str, float] = {}
        for node in ray.nodes():
            if node.get("Alive", True):
                for key, value in (node.get("Resources") or {}).items():
                    largest[key] = max(largest.get(key, 0.0), float(value))
        bundle = self.bundle()
        for i, count in enumerate(self.process_on_nodes):
            short = {k: v * count for k, v in bundle.items() if v * count > largest.get(k, 0.0) + 1e-9}
            if short:
                have = {k: largest.get(k, 0.0) for k in short}
                hint = (
                    f" On CPU each worker takes {self.cpus_per_worker:g} logical CPU: give Ray more logical CPUs than "
                    f"cores with +ray_kwargs.ray_init.num_cpus={int(-(-bundle['CPU'] * count // 1))} (workers then share "
                    "the cores), or use fewer workers."
                    if "CPU" in short and self.resource_name == "CPU"
                    else ""
                )
                raise PlacementError(
                    f"RayResourcePool(process_on_nodes={self.process_on_nodes}) can never be placed: node {i} needs "
                    f"{short} on one machine, the largest machine has {have}.{hint}"
                )

    def _placement_message(self, unplaced: list[int], timeout: float) -> str:
        bundle = self.bundle()
        keys = sorted(set(bundle) | {"CPU"})
        free, cluster = ray.available_resources(), ray.cluster_resources()
        available = {k: free.get(k, 0.0) for k in keys}
        total = {k: cluster.get(k, 0.0) for k in keys}
        wanted = ", ".join(f"node {i}: {self.process_on_nodes[i]} x {bundle}" for i in unplaced)
        return (
            f"RayResourcePool(process_on_nodes={self.process_on_nodes}) could not be placed within {timeout:g} s: "
            f"requested STRICT_PACK bundles ({wanted}; each node's bundles must fit on one machine), "
            f"cluster available {available}, total {total}. Lower the workers per node or cpus_per_worker, "
            "shut down groups holding resources, or add nodes."
        )

    def remove_placement_groups(self) -> None:
        """Remove the pool's placement groups (kills any actor still in them); the next use re-creates them."""
        pgs, self._pgs = self._pgs, None
        for pg in pgs or ():
            remove_placement_group(pg)

    def _acquire(self) -> list[PlacementGroup]:
        pgs = self.get_placement_groups()
        self._users += 1
        return pgs

    def _release(self) -> None:
        self._users = max(self._users - 1, 0)
        if self._users == 0:
            self.remove_placement_groups()

    def __repr__(self) -> str:
        state = "placed" if self._pgs is not None else "not placed"
        return f"<RayResourcePool {self.process_on_nodes} {self.bundle()} {state}>"
