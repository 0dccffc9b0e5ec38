"""The SFT trainer's processes: torchrun's world, the process group, and the few collectives the loop needs.

verl launches its SFT trainer with torchrun (``torchrun --nproc_per_node=N -m verl.trainer.sft_trainer ...``): every
rank runs the same loop, reads the same rows, trains its share of each step and writes its shard of each
checkpoint. ``verl sft`` with ``trainer.n_gpus_per_node=N > 1`` starts those N ranks itself
(:func:`torchrun_command`). One process (no ``WORLD_SIZE``) needs no process group at all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from verl.config.errors import ConfigError


@attrs.frozen
class SFTWorld:
    """Where this process sits: ``rank`` of ``world_size`` (torchrun's ``RANK`` / ``WORLD_SIZE``), ``local_rank``
    on its node (``LOCAL_RANK``)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run folder's own files (config, metrics, tracker)."""
        return self.rank == 0


def torchrun_world(nnodes: int, n_gpus_per_node: int, environ: Any = None) -> SFTWorld:
    """This process's :class:`SFTWorld`, checked against ``trainer.nnodes`` x ``trainer.n_gpus_per_node``.

    Under torchrun the world is torchrun's. verl's torchrun SFT trainer leaves ``n_gpus_per_node`` at 1 whatever
    ``--nproc_per_node`` is, so 1 (and ``nnodes`` 1) accepts any torchrun world; other values must agree with it.

    Raises:
        ConfigError: the keys disagree with torchrun's world, or ask for several processes without torchrun (``verl
            sft`` starts a one-node world itself; :func:`torchrun_command`).
    """
    env = os.environ if environ is None else environ
    wanted = nnodes * n_gpus_per_node
    if "WORLD_SIZE" not in env:
        if wanted > 1:
            raise ConfigError(
                f"trainer.nnodes x trainer.n_gpus_per_node = {wanted} processes, but this one was not started by "
                "torchrun (no WORLD_SIZE): run `verl sft` (it starts one node's processes itself) or torchrun "
                f"--nnodes={nnodes} --nproc_per_node={n_gpus_per_node} -m verl.trainer.sft_trainer ...",
                key="trainer.n_gpus_per_node",
            )
        return SFTWorld()
    world = SFTWorld(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])))
    local = int(env.get("LOCAL_WORLD_SIZE", world.world_size))
    if n_gpus_per_node != 1 and n_gpus_per_node != local:
        raise ConfigError(
            f"trainer.n_gpus_per_node={n_gpus_per_node} but torchrun started {local} processes on this node "
            "(--nproc_per_node): make them agree (or leave n_gpus_per_node at 1: torchrun's count is used)",
            key="trainer.n_gpus_per_node",
        )
    if nnodes != 1 and wanted != world.world_size:
        raise ConfigError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {wanted} but torchrun's world has {world.world_size} "
            "processes (WORLD_SIZE): make them agree",
            key="trainer.nnodes",
        )
    return world


def torchrun_command(n_procs: int, argv: Sequence[str]) -> list[str]:
    """The command that runs ``verl sft argv`` as ``n_procs`` ranks on this node: torch's own launcher
    (``python -m torch.distributed.run --standalone``, i.e. torchrun) on ``-m verl.trainer.sft_trainer``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={n_procs}",
        "-m",
        "verl.trainer.sft_trainer",
        *argv,
    ]


def join_process_group(world: SFTWorld, platform: Any) -> None:
    """Join torchrun's world over the platform's backend (gloo on cpu, nccl on cuda), after pinning this rank's
    device; a one-process run joins nothing."""
    import torch.distributed as dist

    if platform.name != "cpu" and platform.device_count() > 0:
        platform.set_device(world.local_rank % platform.device_count())
    if world.world_size == 1 or dist.is_initialized():
        return
    dist.init_process_group(backend=platform.dist_backend, rank=world.rank, world_size=world.world_size)


def all_reduce_sum(values: Sequence[float], device: Any, world: SFTWorld) -> list[float]:
    """``values`` summed over every rank (float64 on ``device``); the values themselves in a one-process run."""
    if world.world_size == 1:
        return [float(v) for v in values]
    import torch.distributed as dist

    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return [float(v) for v in tensor.cpu().tolist()]


def broadcast_from_main(obj: Any, world: SFTWorld) -> Any:
    """Rank 0's ``obj`` on every rank (``broadcast_object_list``); ``obj`` itself in a one-process run."""
    if world.world_size == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(world: SFTWorld) -> None:
    """Wait for every rank (nothing to wait for in a one-process run)."""
    if world.world_size > 1:
        import torch.distributed as dist

        dist.barrier()


def leave_process_group(world: SFTWorld) -> None:
    """Tear the process group down at the end of a multi-process run."""
    import torch.distributed as dist

    if world.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
