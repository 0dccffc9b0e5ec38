"""A Ray worker that dies mid-run: a clear error naming it, a clean stop, and a resume from the last checkpoint."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("verl_fsdp")

pytestmark = pytest.mark.multiprocess


def _kill_rank_1_after_first_checkpoint(ckpt: Path, stop: threading.Event) -> None:
    """As an out-of-memory kill or a lost node would: rank 1's process dies during step 2."""
    import ray

    tracker = ckpt / "latest_checkpointed_iteration.txt"
    while not stop.is_set():
        if tracker.exists() and tracker.read_text().strip() == "1":
            ray.kill(ray.get_actor("actor_rollout_ref_ActorRolloutRefWorker_1"), no_restart=True)
            return
        time.sleep(0.02)


def test_dead_worker_stops_the_run_and_resume_finishes_it(ray_runtime, run_train, tmp_path: Path, capsys) -> None:
    args = (
        "trainer.controller=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.strategy=fsdp",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    )
    run_dir = tmp_path / "run"
    stop = threading.Event()
    killer = threading.Thread(target=_kill_rank_1_after_first_checkpoint, args=(run_dir / "ckpt", stop), daemon=True)
    killer.start()
    try:
        rows = run_train(run_dir, *args, steps=3, exit_code=1)
    finally:
        stop.set()
        killer.join()
    err = capsys.readouterr().err
    assert "ActorRolloutRefWorker" in err and "rank 1" in err and "died" in err, err
    assert "stopped at step 1; rerun to resume" in err
    # The kill may land before step 1's metrics row is written (it races the end of step 1).
    assert [r["step"] for r in rows] in ([], [1])
    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert not (ckpt / "global_step_2").exists()
    # Same command again: resumes from step 1's sharded checkpoint and finishes.
    rows = run_train(run_dir, *args, steps=3)
    assert [r["step"] for r in rows][-2:] == [2, 3]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (run_dir / "final_hf" / "model.safetensors").exists()
