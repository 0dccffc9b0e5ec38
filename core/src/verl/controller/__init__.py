"""Single controller: workers, ``@register``-ed methods, dispatch modes and worker groups.

The driver holds a :class:`WorkerGroup` and calls the worker class's registered methods on it; the
group dispatches the arguments to its ranks, executes and collects (see :mod:`.dispatch`). Backends:
:class:`LocalWorkerGroup` (in-process, the embedded default) and the Ray group, which implement the same
protocol and return the same results. Importing this package does not import torch.
"""

from verl.controller.colocate import create_colocated_worker_cls
from verl.controller.decorator import (
    MAGIC_ATTR,
    Dispatch,
    DynamicEnum,
    Execute,
    get_predefined_dispatch_fn,
    get_register_attrs,
    register,
    register_dispatch_mode,
    registered_methods,
    unregister_dispatch_mode,
    update_dispatch_mode,
)
from verl.controller.dispatch import PADDED_ROWS_KWARG, PADDING_SIZE_KWARG
from verl.controller.errors import DispatchError, WorkerError
from verl.controller.futures import WorkerFuture
from verl.controller.local import LocalWorkerGroup
from verl.controller.worker import DistGlobalInfo, DistRankInfo, Worker, WorkerMeta
from verl.controller.worker_group import ClassWithInitArgs, WorkerGroup

__all__ = [
    "MAGIC_ATTR",
    "PADDED_ROWS_KWARG",
    "PADDING_SIZE_KWARG",
    "ClassWithInitArgs",
    "Dispatch",
    "DispatchError",
    "DistGlobalInfo",
    "DistRankInfo",
    "DynamicEnum",
    "Execute",
    "LocalWorkerGroup",
    "Worker",
    "WorkerError",
    "WorkerFuture",
    "WorkerGroup",
    "WorkerMeta",
    "create_colocated_worker_cls",
    "get_predefined_dispatch_fn",
    "get_register_attrs",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "unregister_dispatch_mode",
    "update_dispatch_mode",
]
