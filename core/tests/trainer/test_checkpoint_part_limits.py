"""``trainer.max_critic_ckpt_to_keep``: the critic part is pruned from older checkpoints (issue #15).

Expected folders written out by hand from verl's rule (each role keeps its newest N checkpoints).
"""

from __future__ import annotations

import pytest

from verl.trainer.checkpoint import CheckpointManager, verify_checkpoint


def _save_steps(manager: CheckpointManager, steps) -> None:
    for step in steps:
        manager.save(step, {"actor": {"w": step}, "critic": {"v": step}, "data.json": {"s": step}})


def _parts(root, step):
    folder = root / f"global_step_{step}"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None


def test_critic_kept_in_the_newest_n_while_actor_rotation_keeps_its_own_count(tmp_path):
    manager = CheckpointManager(tmp_path, max_ckpt_to_keep=3, part_limits={"critic": 2})
    _save_steps(manager, [1, 2, 3, 4])
    assert _parts(tmp_path, 1) is None  # rotated out whole (max_actor_ckpt_to_keep=3)
    assert _parts(tmp_path, 2) == ["actor", "data.json", "manifest.json"]  # critic pruned: only 3, 4 keep it
    assert _parts(tmp_path, 3) == ["actor", "critic", "data.json", "manifest.json"]
    assert _parts(tmp_path, 4) == ["actor", "critic", "data.json", "manifest.json"]
    # the pruned checkpoint still verifies: its manifest no longer lists the critic's files and says why
    manifest = verify_checkpoint(tmp_path / "global_step_2")
    assert sorted(manifest["files"]) == ["actor/state.pt", "data.json"]
    assert manifest["pruned"] == ["critic"]


def test_no_limit_keeps_every_critic_and_a_resumed_manager_counts_the_ones_on_disk(tmp_path):
    _save_steps(CheckpointManager(tmp_path, part_limits={"critic": None}), [1, 2, 3])
    assert all("critic" in _parts(tmp_path, s) for s in (1, 2, 3))
    _save_steps(CheckpointManager(tmp_path, part_limits={"critic": 1}), [4])
    assert [("critic" in _parts(tmp_path, s)) for s in (1, 2, 3, 4)] == [False, False, False, True]
    assert not list(tmp_path.glob("global_step_*/critic.del-*"))


def test_a_negative_limit_is_refused():
    with pytest.raises(ValueError, match="part_limits\\['critic'\\]"):
        CheckpointManager("unused", part_limits={"critic": -1})
