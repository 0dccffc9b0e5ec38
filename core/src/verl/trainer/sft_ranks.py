"""The SFT trainer's processes: torchrun's world, the process group, and the few collectives the loop needs.

verl launches its SFT trainer with torchrun (``torchrun --nproc_per_node=N -m verl.trainer.sft_trainer ...``): every
rank runs the same loop, reads the same rows, trains its share of each step and writes its shard of each
checkpoint. ``verl sft`` with ``trainer.n_gpus_per_node=N > 1`` starts those N ranks itself (:func:`launch_ranks`:
torchrun's environment, torch's process supervisor, a rendezvous store on loopback). One process (no
``WORLD_SIZE``) needs no process group at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
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
            sft`` starts a one-node world itself; :func:`launch_ranks`).
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


def rank_environments(n_procs: int, master_port: int) -> dict[int, dict[str, str]]:
    """The environment of each of ``n_procs`` ranks on this node, as torchrun would give them, with the rendezvous on
    loopback: ``RANK`` / ``LOCAL_RANK``, ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` 0, ``MASTER_ADDR``
    127.0.0.1, ``MASTER_PORT`` (rank 0 hosts the store there, listening on loopback only), and Gloo's / NCCL's
    interface pinned to loopback unless set already."""
    from verl.platform.network import LOOPBACK_HOST, loopback_collective_env

    shared = {
        **loopback_collective_env(nccl=True),
        "WORLD_SIZE": str(n_procs),
        "LOCAL_WORLD_SIZE": str(n_procs),
        "GROUP_RANK": "0",
        "MASTER_ADDR": LOOPBACK_HOST,
        "MASTER_PORT": str(master_port),
    }
    return {rank: {**shared, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(n_procs)}


def launch_ranks(n_procs: int, argv: Sequence[str]) -> int:
    """Run ``verl sft argv`` as ``n_procs`` ranks of ``python -m verl.trainer.sft_trainer`` on this node; return the
    first failing rank's exit code (0 when every rank succeeded).

    torch's own process supervisor (``torch.distributed.elastic.multiprocessing.start_processes``, what torchrun runs
    its ranks with) starts, watches and stops the ranks: when one fails the others are stopped; on Ctrl-C the ranks
    (which got it too) stop on their own and the launcher waits for them; a SIGTERM to the launcher is forwarded to
    them. Returns ``128 + signal`` then. Not torchrun itself:
    torchrun's agent serves its rendezvous store from torch's ``TCPStore``, which listens on every interface; here
    rank 0 hosts the store on 127.0.0.1 (:func:`verl.platform.network.join_default_group`).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    from verl.platform.network import free_port

    context = start_processes(
        name="verl_sft",
        entrypoint=sys.executable,
        args={rank: ("-m", "verl.trainer.sft_trainer", *argv) for rank in range(n_procs)},
        envs=rank_environments(n_procs, free_port()),
        logs_specs=DefaultLogsSpecs(),  # output goes straight to this terminal
    )
    try:
        result = context.wait()
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM to this launcher (verl sft installs verl.trainer.stops)
        signum = int(getattr(exc, "signum", signal.SIGINT))
        if signum == signal.SIGINT:  # a terminal's Ctrl-C reached the ranks too: let them stop cleanly first
            with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop them now
                context.wait(timeout=120)
        context.close(death_sig=signal.SIGTERM)  # the stop forwarded to ranks still running; then killed
        return 128 + signum
    if result is None:  # still running: wait() only returns early on failure or completion
        context.close()
        return 1
    if result.is_failed():
        context.close()
        first = min(result.failures.values(), key=lambda failure: failure.timestamp)
        return int(first.exitcode) if first.exitcode else 1
    return 0


def join_process_group(world: SFTWorld, platform: Any) -> None:
    """Join torchrun's world over the platform's backend (gloo on cpu, nccl on cuda), after pinning this rank's
    device; a one-process run joins nothing."""
    import torch.distributed as dist

    from verl.platform.network import join_default_group

    if platform.name != "cpu" and platform.device_count() > 0:
        platform.set_device(world.local_rank % platform.device_count())
    if world.world_size == 1 or dist.is_initialized():
        return
    # torchrun's agent serves the store; on one node Gloo's and NCCL's own sockets are pinned to loopback.
    join_default_group(platform.dist_backend, owner="verl sft")


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
