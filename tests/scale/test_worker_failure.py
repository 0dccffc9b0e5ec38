"""A Ray worker that dies mid-run: a clear error naming it, a clean stop, and a resume from the last checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("verl_fsdp")

pytestmark = pytest.mark.multiprocess

# A reward function runs on the driver: in the reward stage of step 2 (after step 1 was checkpointed) it
# kills rank 1's process once, as an out-of-memory kill or a lost node would.
KILLER = """
import threading
from pathlib import Path

MARK = Path({mark!r})
_LOCK = threading.Lock()
_CALLS = [0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    import ray

    with _LOCK:
        _CALLS[0] += 1
        # 4 samples per step: the 5th call is step 2's first sample.
        kill = _CALLS[0] == 5 and not MARK.exists()
        if kill:
            MARK.write_text("killed")
    if kill:
        ray.kill(ray.get_actor("actor_rollout_ref_ActorRolloutRefWorker_1"), no_restart=True)
    return float(len(solution_str or "") % 3) / 2
"""


def test_dead_worker_stops_the_run_and_resume_finishes_it(ray_runtime, run_train, tmp_path: Path, capsys) -> None:
    reward = tmp_path / "killer.py"
    reward.write_text(KILLER.format(mark=str(tmp_path / "killed")))
    args = (
        "trainer.controller=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.strategy=fsdp",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        f"custom_reward_function.path={reward}",
    )
    run_dir = tmp_path / "run"
    rows = run_train(run_dir, *args, steps=2, exit_code=1)
    err = capsys.readouterr().err
    assert "ActorRolloutRefWorker" in err and "rank 1" in err and "died" in err, err
    assert "stopped at step 1; rerun to resume" in err
    assert [r["step"] for r in rows] == [1]
    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert not (ckpt / "global_step_2").exists()
    # Same command again: resumes from step 1's sharded checkpoint and finishes.
    rows = run_train(run_dir, *args, steps=2)
    assert [r["step"] for r in rows] == [1, 2]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (run_dir / "final_hf" / "model.safetensors").exists()
