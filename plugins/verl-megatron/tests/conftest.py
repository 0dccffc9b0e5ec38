"""Launch the two-rank Megatron scenarios (gloo, CPU) once per layout and session and hand their results to the tests.

Megatron's parallel state is per process, so every layout of ``megatron_scenarios.LAYOUTS`` is its own launch
of 2 ranks (``verl.testing.distributed.run_ranks``), started the first time a test asks for it. The world-1
``export`` run (layout refusal, TP=1 read, ``merge_to_hf``) reads the TP=2 launch's checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from verl.testing.distributed import load_script, run_ranks

HERE = Path(__file__).parent
SCRIPT = HERE / "megatron_scenarios.py"
WORLD = 2
TIMINGS: dict[str, float] = {}  # launch -> wall seconds (printed by the terminal summary)


@pytest.fixture(scope="session")
def scenarios() -> Any:
    """``megatron_scenarios.py`` imported by path (test dirs are not packages)."""
    return load_script(SCRIPT, "megatron_scenarios")


@pytest.fixture(scope="session")
def megatron_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``model``: the conformance kit's model; ``other``: the same architecture from another seed (a fresh engine
    whose weights differ from the checkpoint it then loads)."""
    from verl.testing.conformance.inputs import save_conformance_model

    root = tmp_path_factory.mktemp("megatron_models")
    return {"model": save_conformance_model(root / "model"), "other": save_conformance_model(root / "other", seed=1)}


@pytest.fixture(scope="session")
def megatron_launch(
    tmp_path_factory: pytest.TempPathFactory, megatron_models: dict[str, Path]
) -> Callable[[str], tuple[Path, list[dict]]]:
    """``launch(layout) -> (out_dir, [rank0_results, rank1_results])``, each layout run once per session."""
    out = tmp_path_factory.mktemp("megatron2")
    cache: dict[str, tuple[Path, list[dict]]] = {}

    def launch(layout: str) -> tuple[Path, list[dict]]:
        if layout not in cache:
            start = time.perf_counter()
            args = [str(out), layout, str(megatron_models["model"]), str(megatron_models["other"])]
            run_ranks(SCRIPT, args, world_size=WORLD, timeout_s=240)
            TIMINGS[layout] = time.perf_counter() - start
            cache[layout] = out, [torch.load(out / f"{layout}_rank{r}.pt", weights_only=False) for r in range(WORLD)]
        return cache[layout]

    return launch


@pytest.fixture(scope="session")
def megatron_export(megatron_launch: Callable, megatron_models: dict[str, Path]) -> tuple[Path, dict]:
    """``(out_dir, results)`` of the world-1 ``export`` run on the TP=2 launch's checkpoint."""
    out, _ = megatron_launch("tp2")
    start = time.perf_counter()
    run_ranks(SCRIPT, [str(out), "export", str(out / "ckpt_tp2"), str(megatron_models["model"])], world_size=1)
    TIMINGS["export"] = time.perf_counter() - start
    return out, torch.load(out / "export.pt", weights_only=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        shown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in TIMINGS.items())
        terminalreporter.write_line(f"megatron launches: {shown}")


@pytest.fixture(scope="module")
def megatron_world_of_one() -> Any:
    """A 1-rank gloo group for the in-process engines of one test module; Megatron's parallel state and the group
    (when this fixture made it) are torn down after the module, so the next module starts clean."""
    import torch.distributed as dist

    from verl.engines.weight_sync import free_port

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if created:
        dist.destroy_process_group()
