"""Ray backend of the single controller: workers as Ray actors placed in placement groups.

    from verl.controller.ray import init_ray, RayResourcePool, RayWorkerGroup

    init_ray()                                            # joins RAY_ADDRESS, else starts a small local cluster
    pool = RayResourcePool([2])                           # 2 workers on one node (CPU platform by default)
    with RayWorkerGroup(pool, ClassWithInitArgs(MyWorker, cfg)) as wg:
        wg.init_model()                                   # same driver-side API as LocalWorkerGroup

:class:`RayWorkerGroup` implements the :class:`~verl.controller.WorkerGroup` primitives with actor calls
and ``ray.get``; dispatch, collection, futures and colocation views are shared with the in-process
backend, so both return identical results. Only this package imports Ray (``import verl.controller`` does
not). Source: verl/single_controller/ray/base.py.
"""

try:
    import ray  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only where ray is absent
    if exc.name != "ray":
        raise
    raise ImportError(
        "controller=ray needs Ray: pip install ray (or, from the verl checkout, pip install './core[ray]')"
    ) from exc

from verl.controller.ray.resource_pool import PlacementError, RayResourcePool
from verl.controller.ray.runtime import init_ray
from verl.controller.ray.worker_group import RayWorkerGroup, WorkerDiedError

__all__ = ["PlacementError", "RayResourcePool", "RayWorkerGroup", "WorkerDiedError", "init_ray"]
