"""Launch the two-rank FSDP scenarios once per session (gloo, CPU) and hand their results to the tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl.engines.weight_sync import free_port

HERE = Path(__file__).parent
WORLD = 2


def load_scenarios():
    """Import ``fsdp_scenarios.py`` by path (test dirs are not packages)."""
    spec = importlib.util.spec_from_file_location("fsdp_scenarios", HERE / "fsdp_scenarios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def scenarios():
    return load_scenarios()


@pytest.fixture(scope="session")
def two_rank_results(tmp_path_factory):
    """``(out_dir, [rank0_results, rank1_results])`` of ``fsdp_scenarios.run`` over 2 gloo ranks."""
    out = tmp_path_factory.mktemp("fsdp2")
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "fsdp_scenarios.py"), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed (rc={proc.returncode}):\n{log[-6000:]}"
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
