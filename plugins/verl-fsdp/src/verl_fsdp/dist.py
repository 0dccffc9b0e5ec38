"""Process-group helpers for the FSDP engine: joining the default group and small all-reduces.

The worker normally initialises ``torch.distributed`` itself (``init_process_group(platform.dist_backend,
init_method="env://")`` from ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``);
:func:`ensure_process_group` covers the other cases so the engine also runs in one plain process.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from verl.engines.weight_sync.group import free_port

logger = logging.getLogger(__name__)

_ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def ensure_process_group(backend: str = "gloo", timeout_s: float | None = None) -> bool:
    """Make sure the default process group exists; return True if this call created it.

    * already initialised: nothing happens (whatever backend it uses);
    * ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` all set: ``init_process_group(backend,
      init_method="env://")`` (torchrun, Ray worker groups);
    * otherwise (a lone process): a 1-rank group of ``backend`` on a free local port.

    Args:
        backend: ``gloo`` (cpu), ``nccl`` (cuda), ``hccl`` (npu): the platform's ``dist_backend``.
        timeout_s: the group's collective timeout in seconds (``actor_rollout_ref.nccl_timeout``); None =
            torch's default.

    Raises:
        RuntimeError: only some of the rendezvous variables are set (names the missing ones).
    """
    if dist.is_initialized():
        return False
    present = [k for k in _ENV_KEYS if os.environ.get(k)]
    if present and len(present) < len(_ENV_KEYS):
        missing = [k for k in _ENV_KEYS if k not in present]
        raise RuntimeError(
            f"torch.distributed rendezvous is half configured: {present} set but {missing} missing; "
            "set all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or none for a single process)"
        )
    extra = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    if present:
        dist.init_process_group(backend=backend, init_method="env://", **extra)
    else:
        dist.init_process_group(
            backend=backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, **extra
        )
        logger.info("verl-fsdp: started a 1-rank %s process group (no RANK/WORLD_SIZE in the environment)", backend)
    return True


def all_reduce(values: Sequence[float | int], op: str, device: torch.device) -> list[float]:
    """All-reduce a short list of numbers over the default group (``op``: ``"sum"`` or ``"max"``).

    Sums are done in float64 so integer token counts up to 2**53 stay exact.
    """
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return [float(v) for v in tensor.cpu().tolist()]
