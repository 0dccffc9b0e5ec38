"""Process-group helpers for the FSDP engine: joining the default group and small all-reduces.

The worker normally initialises ``torch.distributed`` itself (:func:`verl.platform.network.init_process_group` at
``MASTER_ADDR``/``MASTER_PORT``); :func:`ensure_process_group` covers the other cases so the engine also runs in
one plain process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist

from verl.platform.network import join_default_group

logger = logging.getLogger(__name__)


def ensure_process_group(backend: str = "gloo", timeout_s: float | None = None) -> bool:
    """Make sure the default process group exists; return True if this call created it.

    :func:`verl.platform.network.join_default_group`: with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
    set (torchrun, Ray worker groups) the ranks join at that address, rank 0's store listening on it only; a lone
    process gets a 1-rank group of ``backend`` on loopback.

    Args:
        backend: ``gloo`` (cpu), ``nccl`` (cuda), ``hccl`` (npu): the platform's ``dist_backend``.
        timeout_s: the group's collective timeout in seconds (``actor_rollout_ref.nccl_timeout``); None =
            torch's default.

    Raises:
        RuntimeError: only some of the rendezvous variables are set (names the missing ones).
    """
    return join_default_group(backend, timeout_s, owner="verl-fsdp")


def all_reduce(values: Sequence[float | int], op: str, device: torch.device) -> list[float]:
    """All-reduce a short list of numbers over the default group (``op``: ``"sum"`` or ``"max"``).

    Sums are done in float64 so integer token counts up to 2**53 stay exact.
    """
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return [float(v) for v in tensor.cpu().tolist()]
