"""The hybrid engine end to end on 2 Ray actors (gloo): FSDP DP=2 training, an hf rollout of tensor-parallel
size 2 fed by the resharded weight sync, and the colocated placement (rollout in its own processes on the
trainer's devices), each against the one-process run.

Step 2 samples with the weights step 1 trained: if the sync did not reach (or corrupted) the rollout's shards,
step 2's responses and rewards would differ from the local run's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("verl_fsdp")

pytestmark = pytest.mark.multiprocess

SAME = ("response_length/mean", "critic/score/mean", "critic/advantages/mean")
CLOSE = ("actor/pg_loss", "actor/grad_norm")


@pytest.fixture(scope="module")
def local(run_train, tmp_path_factory):
    return run_train(tmp_path_factory.mktemp("hybrid_local"), steps=2)


def _assert_matches(run, local):
    assert [r["step"] for r in run] == [r["step"] for r in local] == [0, 1, 2]
    for a, b in zip(local[1:], run[1:], strict=True):
        for key in SAME:
            assert b[key] == pytest.approx(a[key], abs=1e-6), (a["step"], key)
        for key in CLOSE:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_fsdp_dp2_into_tp2_rollout_matches_the_local_run(ray_runtime, run_train, local, tmp_path: Path) -> None:
    run = run_train(
        tmp_path / "tp2",
        "trainer.controller=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.colocated.bucket_bytes=8192",
        steps=2,
    )
    _assert_matches(run, local)
    for row in run[1:]:
        assert row["weight_sync/shared"] == 0.0 and row["weight_sync/skipped_tied"] == 1.0
        assert row["weight_sync/buckets"] >= 2 and row["weight_sync/full_gathers"] == 0
        assert row["timing_s/update_weights"] > 0 and row["timing_s/sleep"] >= 0
        assert row["memory/train/peak_allocated_gb"] > 0 and row["perf/max_memory_allocated_gb"] > 0


def test_colocated_rollout_processes_match_the_local_run(ray_runtime, run_train, local, tmp_path: Path) -> None:
    run = run_train(
        tmp_path / "colocated",
        "trainer.controller=ray",
        "actor_rollout_ref.rollout.placement=colocated",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=broadcast",
        steps=2,
    )
    _assert_matches(run, local)
    assert run[2]["timing_s/update_weights"] > 0 and run[2]["weight_sync/buckets"] >= 1
