"""Launch the two-rank FSDP scenarios once per session (gloo, CPU) and hand their results to the tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl.testing.distributed import load_script, run_ranks

HERE = Path(__file__).parent
WORLD = 2


def load_scenarios():
    """Import ``fsdp_scenarios.py`` by path (test dirs are not packages)."""
    return load_script(HERE / "fsdp_scenarios.py")


@pytest.fixture(scope="session")
def scenarios():
    return load_scenarios()


@pytest.fixture(scope="session")
def two_rank_results(tmp_path_factory):
    """``(out_dir, [rank0_results, rank1_results])`` of ``fsdp_scenarios.run`` over 2 gloo ranks."""
    out = tmp_path_factory.mktemp("fsdp2")
    run_ranks(HERE / "fsdp_scenarios.py", [str(out)], world_size=WORLD, timeout_s=240)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
