"""Standalone rollout (``rollout.nnodes > 0``): a separate Ray pool generates, weights move by broadcast.

The rollout pool holds its own copy of the model; after every step the actor's rank 0 broadcasts its
weights (checkpoint engine ``broadcast``). If the sync did not reach the rollout pool, step 2 would
sample from the initial weights and diverge from the hybrid run, so step 2 matching the local run
proves the transfer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.multiprocess


def test_standalone_rollout_pool_matches_hybrid_run(ray_runtime, run_train, tmp_path: Path) -> None:
    local = run_train(tmp_path / "local", steps=2)
    standalone = run_train(
        tmp_path / "standalone",
        "trainer.controller=ray",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=broadcast",
        steps=2,
    )
    assert [row["step"] for row in local] == [row["step"] for row in standalone] == [0, 1, 2]
    for a, b in zip(local[1:], standalone[1:], strict=True):
        for key in ("response_length/mean", "critic/score/mean"):
            assert b[key] == pytest.approx(a[key], abs=1e-6), (a["step"], key)
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    assert standalone[2]["timing_s/update_weights"] > 0
