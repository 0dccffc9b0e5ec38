"""Run a script on several CPU processes that form one torch.distributed (gloo) world, for tests.

Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (what torchrun sets) and one intra-op thread; the script calls
``torch.distributed.init_process_group("gloo")`` itself. A rank that fails or hangs fails the run with the
tail of every rank's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def load_script(path: str | Path, name: str | None = None) -> Any:
    """Import a script file as a module (test folders are not packages), e.g. a scenario file that the
    tests run with :func:`run_ranks` and whose helpers they also use."""
    import importlib.util

    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RanksFailedError(AssertionError):
    """A rank exited with an error or did not finish in time; the message holds every rank's log tail."""


def run_ranks(
    script: str | Path, args: Sequence[str] = (), *, world_size: int = 2, timeout_s: float = 300.0
) -> list[str]:
    """Run ``python script *args`` as ``world_size`` ranks on this host; return each rank's output.

    Raises:
        RanksFailedError: a rank returned non-zero or the run exceeded ``timeout_s`` (all ranks are killed).
    """
    from verl.engines.weight_sync.group import free_port

    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs: list[str] = []
    timed_out = False
    try:
        for proc in procs:
            try:
                logs.append(proc.communicate(timeout=timeout_s)[0])
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc in procs[len(logs) :]:
        logs.append(proc.communicate()[0])
    failed = [rank for rank, proc in enumerate(procs) if proc.returncode != 0]
    if timed_out or failed:
        tails = "\n".join(f"--- rank {r} (rc={procs[r].returncode}) ---\n{logs[r][-4000:]}" for r in range(world_size))
        reason = f"timed out after {timeout_s:.0f} s" if timed_out else f"ranks {failed} failed"
        raise RanksFailedError(f"{script}: {reason}\n{tails}")
    return logs
