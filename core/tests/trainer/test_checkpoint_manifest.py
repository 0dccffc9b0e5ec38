"""The checkpoint manifest (issue #36): sizes and sha256 computed independently, verification naming the file,
resume's fallback to the newest checkpoint that verifies, and rotation that keeps the newest healthy checkpoint."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

from verl.trainer.checkpoint import (
    MANIFEST_FILE,
    CheckpointHealth,
    CheckpointManager,
    CheckpointUnusableError,
    CheckpointVerifyError,
    LegacyCheckpointError,
    verify_checkpoint,
    write_manifest,
)
from verl.trainer.guards import NonFiniteStepGuard


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "global_step_3"
    (folder / "actor").mkdir(parents=True)
    (folder / "data.json").write_bytes(b'{"epoch": 0}\n')
    (folder / "actor" / "w.bin").write_bytes(bytes(range(256)) * 4)
    return folder


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    folder = _folder(tmp_path)
    manifest = write_manifest(folder, step=3, health=CheckpointHealth(True, 2, 0))
    assert json.loads((folder / MANIFEST_FILE).read_text()) == manifest
    assert manifest["files"] == {
        "actor/w.bin": {"size": 1024, "sha256": hashlib.sha256(bytes(range(256)) * 4).hexdigest()},
        "data.json": {"size": 13, "sha256": hashlib.sha256(b'{"epoch": 0}\n').hexdigest()},
    }
    assert manifest["health"] == {"weights_finite": True, "updates_applied": 2, "updates_skipped": 0, "nonfinite": []}
    assert verify_checkpoint(folder) == manifest


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda f: (f / "actor" / "w.bin").unlink(), r"actor/w\.bin: is missing"),
        (lambda f: (f / "actor" / "w.bin").write_bytes(b"x" * 100), r"w\.bin: has 100 bytes.*says 1024 \(truncated\)"),
        (lambda f: (f / "data.json").write_bytes(b'{"epoch": 1}\n'), r"data\.json: is corrupt: its sha256"),
        (lambda f: (f / MANIFEST_FILE).write_text('{"format": '), r"manifest\.json: is not valid JSON"),
        (lambda f: (f / MANIFEST_FILE).unlink(), r"manifest\.json: is missing"),
    ],
)
def test_verification_names_the_damaged_file(tmp_path, damage, match):
    folder = _folder(tmp_path)
    write_manifest(folder, step=3)
    damage(folder)
    with pytest.raises(CheckpointVerifyError, match=match) as info:
        verify_checkpoint(folder)
    assert info.value.folder == folder


def test_a_file_not_in_the_manifest_is_ignored_with_a_warning(tmp_path, caplog):
    folder = _folder(tmp_path)
    write_manifest(folder, step=3)
    (folder / "data.pt").write_bytes(b"planted")
    with caplog.at_level(logging.WARNING, logger="verl.trainer.checkpoint"):
        verify_checkpoint(folder)
    assert "files not in manifest.json are ignored: data.pt" in caplog.text


def test_an_old_format_folder_is_refused_naming_its_pickle_and_the_convert_command(tmp_path):
    folder = tmp_path / "global_step_2"
    (folder / "actor").mkdir(parents=True)
    torch.save({"epoch": 0}, folder / "data.pt")
    torch.save({"model": {}}, folder / "actor" / "model_world_size_1_rank_0.pt")
    with pytest.raises(LegacyCheckpointError, match=r"data\.pt: is in the old pickle format") as info:
        verify_checkpoint(folder)
    assert "actor/model_world_size_1_rank_0.pt" in str(info.value)
    assert f"verl checkpoint convert {folder} --trust-pickle" in str(info.value)


@pytest.mark.parametrize(
    ("health", "healthy"),
    [
        (CheckpointHealth(True, 3, 0), True),
        (CheckpointHealth(True, 1, 5), True),  # some updates applied
        (CheckpointHealth(True, 0, 0), True),  # nothing attempted (e.g. critic warm-up)
        (CheckpointHealth(True, 0, 2), False),  # every update skipped
        (CheckpointHealth(False, 3, 0, ["rank0:w"]), False),
        (CheckpointHealth(None, 3, 0), False),  # unknown is never "healthy"
    ],
)
def test_health_rule(health, healthy):
    assert health.healthy is healthy
    assert CheckpointHealth.from_json(health.to_json()) == health


# ---------------------------------------------------------------- resume picks the newest that verifies
def _save(manager: CheckpointManager, step: int, health: CheckpointHealth | None = None) -> Path:
    return manager.save(step, {"data.json": {"step": step}, "actor": {"w": torch.full((4,), float(step))}}, health)


def test_auto_resume_skips_damaged_checkpoints_and_names_them(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    for step in (1, 2, 3):
        _save(manager, step)
    data = tmp_path / "global_step_3" / "data.json"
    data.write_text(data.read_text().replace("3", "9"))  # same size, other bytes
    (tmp_path / "global_step_2" / "actor" / "state.pt").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="verl.trainer.checkpoint"):
        assert manager.resolve_resume("auto") == (1, tmp_path / "global_step_1")
    assert "global_step_3/data.json: is corrupt" in caplog.text
    assert "global_step_2/actor/state.pt: has 0 bytes" in caplog.text
    assert "resuming from" in caplog.text and "skipped global_step_3" in caplog.text


def test_auto_resume_with_no_usable_checkpoint_stops_listing_each(tmp_path):
    manager = CheckpointManager(tmp_path)
    _save(manager, 1, CheckpointHealth(False, 1, 0, ["rank0:w"]))
    _save(manager, 2)
    (tmp_path / "global_step_2" / "data.json").unlink()
    with pytest.raises(CheckpointUnusableError) as info:
        manager.resolve_resume("auto")
    text = str(info.value)
    assert "global_step_2: checkpoint file" in text and "data.json: is missing (listed in manifest.json)" in text
    assert "global_step_1: it was saved with non-finite weights (rank0:w)" in text
    assert [p.name for p, _ in info.value.problems] == ["global_step_2", "global_step_1"]
    (tmp_path / "global_step_2" / MANIFEST_FILE).unlink()  # no manifest: its state.pt reads as the old format
    with pytest.raises(CheckpointUnusableError, match=r"state\.pt: is in the old pickle format.*--trust-pickle"):
        manager.resolve_resume("resume_path", tmp_path / "global_step_2")


# ---------------------------------------------------------------- rotation keeps the newest healthy checkpoint
def _steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("_")[-1]) for p in root.glob("global_step_*") if "." not in p.name)


def test_rotation_keeps_the_newest_healthy_checkpoint_beyond_the_limit(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, max_ckpt_to_keep=2)
    _save(manager, 1, CheckpointHealth(True, 4, 0))
    _save(manager, 2, CheckpointHealth(True, 2, 0))
    _save(manager, 3, CheckpointHealth(True, 0, 4))  # every update skipped
    assert _steps(tmp_path) == [2, 3]  # the plain rule: step 2 (healthy) is among the 2 newest
    with caplog.at_level(logging.WARNING, logger="verl.trainer.checkpoint"):
        _save(manager, 4, CheckpointHealth(False, 1, 0, ["rank0:w"]))
    assert _steps(tmp_path) == [2, 3, 4]  # 3 and 4 unhealthy: 2 stays on top of them
    assert "keeping" in caplog.text and "global_step_2" in caplog.text and "non-finite weights" in caplog.text
    _save(manager, 5, CheckpointHealth(True, 0, 3))
    assert _steps(tmp_path) == [2, 4, 5]
    _save(manager, 6, CheckpointHealth(True, 1, 3))  # healthy again: back to the plain rule
    assert _steps(tmp_path) == [5, 6]
    # a new manager (a resumed run) reads the health back from the manifests
    resumed = CheckpointManager(tmp_path, max_ckpt_to_keep=1)
    _save(resumed, 7, CheckpointHealth(True, 0, 1))
    assert _steps(tmp_path) == [6, 7]


def test_guard_counts_applied_and_skipped_updates():
    guard = NonFiniteStepGuard(None)
    guard.observe({"actor/skipped_steps": [0.0], "actor/grad_norm": [1.0, 2.0]}, 1)
    guard.observe({"actor/skipped_steps": [1.0], "actor/grad_norm": [float("nan"), 0.5]}, 2)
    guard.observe({"actor/skipped_steps": [3.0], "actor/grad_norm": [float("inf"), float("nan")]}, 3)
    assert (guard.updates_applied, guard.updates_skipped) == (3, 3)


def test_checkpoint_errors_cross_process_boundaries_intact():
    """Workers on Ray raise them: a pickle round trip keeps the type and the message (path, names, reason)."""
    import pickle

    from verl.engines.safe_files import CheckpointFileError, NonFiniteCheckpointError

    errors = [
        CheckpointFileError("/r/global_step_1/data.json", "is not valid JSON"),
        LegacyCheckpointError("/r/global_step_1/data.pt"),
        NonFiniteCheckpointError("/r/global_step_1/actor", ["w", "b"], "optimizer state"),
        CheckpointVerifyError("/r/global_step_1/data.json", "is missing", "/r/global_step_1"),
        CheckpointUnusableError("/r", [(Path("/r/global_step_1"), "damaged")]),
    ]
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
