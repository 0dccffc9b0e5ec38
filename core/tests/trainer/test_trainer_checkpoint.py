"""CheckpointManager: verl layout, atomic save (K18a), rotation incl. resumed checkpoints (K18b), resume (K17)."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.trainer.checkpoint import (
    TRACKER_FILE,
    CheckpointManager,
    CheckpointNotFoundError,
    CheckpointResumeError,
    CheckpointSaveError,
    capture_rng_state,
    first_step_after_resume,
    load_part,
    parse_global_step,
    restore_rng_state,
    write_manifest,
)
from verl.trainer.rng_state import rng_state_from_json, rng_state_to_json

DEAD_PID = 2**22 + 1  # above Linux's PID_MAX_LIMIT: no process can have it


def parts_for(step: int) -> dict:
    return {
        "actor": {"model": {"w": torch.full((2, 2), float(step))}, "optimizer": {"state": {}, "lr": 0.1}},
        "data.json": {"epoch": 0, "batch_in_epoch": step % 4, "seed": 1},
        "trainer_state.json": {"global_steps": step},
    }


def listing(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def tracker(root: Path) -> str:
    return (root / TRACKER_FILE).read_text()


# ---------------------------------------------------------------- layout and loading
def test_save_writes_verl_layout_and_tracker_last(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt")

    def critic_writer(path: Path) -> None:  # an engine writing its own folder
        path.mkdir()
        (path / "model.pt").write_bytes(b"critic")

    out = mgr.save(3, {**parts_for(3), "critic": critic_writer})
    root = tmp_path / "ckpt"
    assert out == root / "global_step_3"
    assert listing(root) == ["global_step_3", TRACKER_FILE]
    assert tracker(root) == "3"  # verl's format: the bare number
    assert sorted(p.name for p in out.iterdir()) == [
        "actor",
        "critic",
        "data.json",
        "manifest.json",
        "trainer_state.json",
    ]
    assert (out / "actor" / "state.pt").is_file()
    assert (out / "critic" / "model.pt").read_bytes() == b"critic"
    actor = load_part(out, "actor")
    assert torch.equal(actor["model"]["w"], torch.full((2, 2), 3.0))
    assert load_part(out, "data.json") == {"epoch": 0, "batch_in_epoch": 3, "seed": 1}
    assert mgr.latest() == (3, out)


def test_load_part_missing_lists_present_parts(tmp_path: Path) -> None:
    out = CheckpointManager(tmp_path).save(1, parts_for(1))
    with pytest.raises(
        CheckpointNotFoundError, match=r"no part 'critic'.*present: \['actor', 'data.json', 'manifest.json'"
    ):
        load_part(out, "critic")


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(5, {"trainer_state.json": {"v": 1}})
    mgr.save(5, {"trainer_state.json": {"v": 2}})
    assert listing(tmp_path) == ["global_step_5", TRACKER_FILE]
    assert load_part(tmp_path / "global_step_5", "trainer_state.json") == {"v": 2}


@pytest.mark.parametrize(
    ("step", "parts", "exc", "match"),
    [
        (-1, {"a.pt": 1}, ValueError, "step must be an int >= 0"),
        (True, {"a.pt": 1}, ValueError, "step must be an int >= 0"),
        (1, {}, ValueError, "non-empty mapping"),
        (1, {"../escape": 1}, ValueError, "relative path"),
        (1, {"/abs": 1}, ValueError, "relative path"),
        (1, {"manifest.json": {}}, ValueError, "writes manifest.json itself"),
        (1, {"actor": torch.nn.Linear(1, 1)}, TypeError, r"state_dict\(\)"),
    ],
)
def test_save_rejects_bad_arguments_before_writing(tmp_path: Path, step, parts, exc, match) -> None:
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(exc, match=match):
        mgr.save(step, parts)
    assert listing(tmp_path) == []


# ---------------------------------------------------------------- K18a: failed save changes nothing
def test_k18a_writer_failure_halfway_keeps_previous_checkpoint(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, max_ckpt_to_keep=1)
    mgr.save(10, parts_for(10))

    def failing_actor(path: Path) -> None:
        path.mkdir()
        (path / "model_world_size_1_rank_0.pt").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    parts = {"data.json": {"epoch": 0}, "actor": failing_actor, "trainer_state.json": {"global_steps": 20}}
    with pytest.raises(CheckpointSaveError) as info:
        mgr.save(20, parts)
    message = str(info.value)
    assert "global_step_20" in message and "'actor'" in message and "No space left on device" in message
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.step == 20

    assert listing(tmp_path) == ["global_step_10", TRACKER_FILE]  # no temp folder, no partial global_step_20
    assert tracker(tmp_path) == "10"
    assert torch.equal(load_part(tmp_path / "global_step_10", "actor")["model"]["w"], torch.full((2, 2), 10.0))
    assert CheckpointManager(tmp_path, max_ckpt_to_keep=1).latest() == (10, tmp_path / "global_step_10")


def test_k18a_tracker_write_failure_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = CheckpointManager(tmp_path, max_ckpt_to_keep=1)
    mgr.save(10, parts_for(10))
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(dst).name == TRACKER_FILE:
            raise PermissionError("read-only filesystem")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(CheckpointSaveError, match=f"writing {TRACKER_FILE}: PermissionError"):
        mgr.save(20, parts_for(20))
    assert listing(tmp_path) == ["global_step_10", TRACKER_FILE]
    assert tracker(tmp_path) == "10"


def test_k18a_failed_overwrite_of_existing_step_restores_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(10, {"trainer_state.json": {"v": "old"}})
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda s, d: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(CheckpointSaveError):
        mgr.save(10, {"trainer_state.json": {"v": "new"}})
    monkeypatch.setattr(os, "replace", real_replace)
    assert listing(tmp_path) == ["global_step_10", TRACKER_FILE]
    assert load_part(tmp_path / "global_step_10", "trainer_state.json") == {"v": "old"}


def test_writer_that_creates_nothing_is_a_save_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointSaveError, match="returned without creating"):
        CheckpointManager(tmp_path).save(1, {"actor": lambda path: None})
    assert listing(tmp_path) == []


def test_keyboard_interrupt_cleans_temp_and_propagates(tmp_path: Path) -> None:
    def interrupted(path: Path) -> None:
        path.write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        CheckpointManager(tmp_path).save(1, {"data.json": interrupted})
    assert listing(tmp_path) == []


# ---------------------------------------------------------------- K18b and retention
def test_k18b_resumed_checkpoint_is_rotated_after_next_save(tmp_path: Path) -> None:
    CheckpointManager(tmp_path, max_ckpt_to_keep=1).save(10, parts_for(10))

    fresh = CheckpointManager(tmp_path, max_ckpt_to_keep=1)  # a new process
    step, path = fresh.resolve_resume("auto")
    assert (step, path) == (10, tmp_path / "global_step_10")
    assert load_part(path, "trainer_state.json") == {"global_steps": 10}
    fresh.save(20, parts_for(20))

    assert listing(tmp_path) == ["global_step_20", TRACKER_FILE]
    assert tracker(tmp_path) == "20"


@pytest.mark.parametrize("keep", [None, 0])
def test_max_ckpt_none_or_zero_keeps_all(tmp_path: Path, keep) -> None:
    mgr = CheckpointManager(tmp_path, max_ckpt_to_keep=keep)
    for step in (1, 2, 3, 4):
        mgr.save(step, {"trainer_state.json": {"s": step}})
    assert listing(tmp_path) == [f"global_step_{s}" for s in (1, 2, 3, 4)] + [TRACKER_FILE]
    assert tracker(tmp_path) == "4"


def test_max_ckpt_two_keeps_newest_two(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, max_ckpt_to_keep=2)
    for step in (5, 10, 15, 20):
        mgr.save(step, {"trainer_state.json": {"s": step}})
    assert listing(tmp_path) == ["global_step_15", "global_step_20", TRACKER_FILE]
    assert mgr.tracked_steps == [15, 20]


def test_rotation_never_deletes_the_checkpoint_just_saved(tmp_path: Path) -> None:
    # a run resumed from an earlier step than one on disk: the new save is the one to keep
    CheckpointManager(tmp_path).save(30, {"trainer_state.json": {}})
    CheckpointManager(tmp_path).save(10, {"trainer_state.json": {}})
    mgr = CheckpointManager(tmp_path, max_ckpt_to_keep=1)
    mgr.save(20, {"trainer_state.json": {}})
    assert listing(tmp_path) == ["global_step_20", TRACKER_FILE]


@pytest.mark.parametrize("keep", [-1, 1.5, True])
def test_bad_max_ckpt_to_keep(tmp_path: Path, keep) -> None:
    with pytest.raises(ValueError, match="max_ckpt_to_keep"):
        CheckpointManager(tmp_path, max_ckpt_to_keep=keep)


# ---------------------------------------------------------------- stale scratch folders and latest()
def test_startup_removes_stale_temp_dirs_and_restores_displaced(tmp_path: Path, caplog) -> None:
    (tmp_path / f"global_step_5.tmp-{DEAD_PID}").mkdir()
    (tmp_path / f"global_step_5.tmp-{DEAD_PID}" / "data.json").write_bytes(b"partial")
    (tmp_path / f"global_step_3.del-{DEAD_PID}").mkdir()
    (tmp_path / f"global_step_7.old-{DEAD_PID}").mkdir()  # replaced, replacement never published
    alive = tmp_path / f"global_step_9.tmp-{os.getppid()}"  # a live process may still be writing it
    alive.mkdir()
    with caplog.at_level(logging.WARNING, logger="verl.trainer.checkpoint"):
        mgr = CheckpointManager(tmp_path)
    assert listing(tmp_path) == ["global_step_7", alive.name]
    assert "removed stale checkpoint scratch folder" in caplog.text and str(DEAD_PID) in caplog.text
    assert mgr.latest() == (7, tmp_path / "global_step_7")  # never the .tmp- folder


def test_latest_without_tracker_scans_complete_dirs(tmp_path: Path) -> None:
    for step in (2, 11):
        (tmp_path / f"global_step_{step}").mkdir()
    (tmp_path / f"global_step_99.tmp-{os.getppid()}").mkdir()
    (tmp_path / "global_step_50").write_text("a file, not a checkpoint")
    assert CheckpointManager(tmp_path).latest() == (11, tmp_path / "global_step_11")


def test_latest_with_unusable_tracker_falls_back(tmp_path: Path) -> None:
    (tmp_path / "global_step_4").mkdir()
    (tmp_path / TRACKER_FILE).write_text("garbage")
    assert CheckpointManager(tmp_path).latest() == (4, tmp_path / "global_step_4")
    (tmp_path / TRACKER_FILE).write_text("8")  # names a folder that is gone
    assert CheckpointManager(tmp_path).latest() == (4, tmp_path / "global_step_4")


def test_latest_empty_dir_is_none(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "new")
    assert mgr.latest() is None
    assert mgr.resolve_resume("auto") is None


# ---------------------------------------------------------------- K17: step bookkeeping and resume paths
def test_k17ab_first_step_after_resume() -> None:
    assert first_step_after_resume(100) == 101
    assert first_step_after_resume(100, sync_interval=4) == 401
    assert first_step_after_resume(0) == 1
    for bad in ({"saved_index": -1}, {"saved_index": 1, "sync_interval": 0}, {"saved_index": 1.0}):
        with pytest.raises(ValueError):
            first_step_after_resume(**bad)


def test_k17a_auto_resume_from_global_step_100(tmp_path: Path) -> None:
    CheckpointManager(tmp_path).save(100, parts_for(100))
    step, _ = CheckpointManager(tmp_path).resolve_resume("auto")
    assert first_step_after_resume(step) == 101


def test_k17c_only_last_path_component_counts(tmp_path: Path) -> None:
    nested = tmp_path / "global_step_900" / "archive" / "global_step_12"
    nested.mkdir(parents=True)
    write_manifest(nested, step=12)  # an (empty) checkpoint that verifies
    mgr = CheckpointManager(tmp_path / "run")
    assert parse_global_step(nested) == 12
    assert parse_global_step(str(nested) + "/") == 12
    assert mgr.resolve_resume("resume_path", str(nested)) == (12, nested)
    with pytest.raises(CheckpointResumeError, match="'archive' is not 'global_step_<N>'"):
        mgr.resolve_resume("resume_path", nested.parent)


@pytest.mark.parametrize("name", ["global_step_12.tmp-5", "global_step_", "global_step_x", "step_12", "global_step_-1"])
def test_parse_global_step_rejects(name: str) -> None:
    with pytest.raises(CheckpointResumeError, match="global_step_<N>"):
        parse_global_step(f"/runs/{name}")


def test_resume_path_relative_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ckpt" / "global_step_3").mkdir(parents=True)
    write_manifest(tmp_path / "ckpt" / "global_step_3", step=3)
    monkeypatch.chdir(tmp_path)
    assert CheckpointManager(tmp_path / "ckpt").resolve_resume("resume_path", "ckpt/global_step_3") == (
        3,
        tmp_path / "ckpt" / "global_step_3",
    )


def test_resume_errors(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    assert mgr.resolve_resume("disable", "/ignored/global_step_1") is None
    with pytest.raises(CheckpointResumeError, match="'latest' is not one of \\['disable', 'auto', 'resume_path'\\]"):
        mgr.resolve_resume("latest")
    with pytest.raises(CheckpointResumeError, match="needs trainer.resume_from_path"):
        mgr.resolve_resume("resume_path", None)
    missing = tmp_path / "nope" / "global_step_7"
    with pytest.raises(CheckpointNotFoundError, match=f"{missing} does not exist"):
        mgr.resolve_resume("resume_path", missing)


# ---------------------------------------------------------------- RNG state
def draw() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trip_through_checkpoint(tmp_path: Path) -> None:
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    draw()
    mgr = CheckpointManager(tmp_path)
    out = mgr.save(1, {"trainer_state.json": {"rng": rng_state_to_json(capture_rng_state())}})
    expected = draw()
    draw()  # move every generator on
    restore_rng_state(rng_state_from_json(load_part(out, "trainer_state.json")["rng"]))
    assert draw() == expected


def test_restore_rng_state_names_missing_keys() -> None:
    with pytest.raises(KeyError, match=r"lacks \['numpy', 'torch_cpu'\]"):
        restore_rng_state({"python": random.getstate()})


class FakeDeviceModule:
    def __init__(self, count: int):
        self.states = [torch.tensor([i, 7], dtype=torch.uint8) for i in range(count)]
        self.set_calls: list[tuple[list[int], int]] = []

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.states)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state(self, state: torch.Tensor, index: int) -> None:
        self.set_calls.append((state.tolist(), index))


class FakePlatform:
    def __init__(self, device_type: str, count: int):
        self.device_type = device_type
        self.device_module = FakeDeviceModule(count)


def test_device_rng_goes_through_the_platform(caplog) -> None:
    saved = capture_rng_state(FakePlatform("fakedev", 2))
    assert [s.tolist() for s in saved["device"]["states"]] == [[0, 7], [1, 7]]
    assert saved["device"]["device_type"] == "fakedev"

    same = FakePlatform("fakedev", 2)
    restore_rng_state(saved, same)
    assert same.device_module.set_calls == [([0, 7], 0), ([1, 7], 1)]

    other = FakePlatform("otherdev", 2)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.checkpoint"):
        restore_rng_state(saved, other)
    assert other.device_module.set_calls == []
    assert "not restoring fakedev RNG state" in caplog.text


def test_cpu_platform_has_no_device_rng() -> None:
    from verl.platform.cpu import CpuPlatform

    assert "device" not in capture_rng_state(CpuPlatform())
