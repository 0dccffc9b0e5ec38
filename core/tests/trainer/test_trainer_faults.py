"""Fault-injection hook (VERL_FAULT_INJECT), the checkpoint-write fault point, and metrics.jsonl rewind on resume."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.trainer import faults
from verl.trainer.checkpoint import TRACKER_FILE, CheckpointManager, CheckpointSaveError
from verl.trainer.tracking import METRICS_FILE, FileBackend, Tracking


@pytest.fixture(autouse=True)
def _disarm():
    faults.arm({})
    yield
    faults.arm({})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("gen:2", ("gen", 2, "kill")),
        ("update_actor:13:kill", ("update_actor", 13, "kill")),
        (" checkpoint_write:1:oserror ", ("checkpoint_write", 1, "oserror")),
    ],
)
def test_parse(spec, expected):
    assert faults.parse(spec) == expected


@pytest.mark.parametrize("spec", ["gen", "gen:0", "gen:-1", "gen:x", "generate:2", "gen:2:explode", "gen:2:kill:1"])
def test_parse_rejects_with_the_variable_and_choices(spec):
    with pytest.raises(ValueError, match=r"VERL_FAULT_INJECT=.*stage in \['gen'"):
        faults.parse(spec)


def test_unset_or_empty_disarms():
    assert faults.arm({faults.ENV_VAR: "gen:1"}) == ("gen", 1, "kill")
    assert faults.arm({faults.ENV_VAR: ""}) is None
    faults.check("gen", 1)  # disarmed: returns
    assert faults.arm({}) is None


def test_oserror_action_fires_only_at_its_stage_and_step():
    faults.arm({faults.ENV_VAR: "adv:3:oserror"})
    faults.check("adv", 2)
    faults.check("gen", 3)
    with pytest.raises(OSError) as info:
        faults.check("adv", 3)
    assert info.value.errno == errno.ENOSPC and "No space left on device" in str(info.value)


def test_kill_action_sigkills_the_process():
    code = "from verl.trainer import faults; faults.arm(); faults.check('gen', 2); print('alive')"
    env = {**os.environ, faults.ENV_VAR: "gen:2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and "alive" not in proc.stdout


def test_failed_checkpoint_write_names_the_path_and_keeps_previous_k18(tmp_path: Path):
    manager = CheckpointManager(tmp_path, max_ckpt_to_keep=1)
    manager.save(1, {"a.pt": {"x": 1}, "b.pt": {"y": 2}})
    faults.arm({faults.ENV_VAR: "checkpoint_write:2:oserror"})
    with pytest.raises(CheckpointSaveError) as info:
        manager.save(2, {"a.pt": {"x": 3}, "b.pt": {"y": 4}})
    message = str(info.value)
    assert str(tmp_path / "global_step_2") in message and "No space left on device" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", TRACKER_FILE]
    assert (tmp_path / TRACKER_FILE).read_text() == "1"
    assert CheckpointManager(tmp_path).resolve_resume("auto") == (1, tmp_path / "global_step_1")
    faults.arm({})
    manager.save(2, {"a.pt": {"x": 3}, "b.pt": {"y": 4}})  # the next save works and only then rotates 1 out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", TRACKER_FILE]


def _write_rows(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_rewind_drops_rows_after_the_resumed_step_and_torn_lines(tmp_path: Path):
    rows = [json.dumps({"step": s, "m": s / 10}) for s in (0, 1, 2, 3, 4)] + ['{"step": 5, "m"']
    _write_rows(tmp_path / METRICS_FILE, rows)
    backend = FileBackend(tmp_path)
    assert backend.rewind(2) == 3  # rows 3, 4 and the torn line
    backend.log({"m": 0.3}, step=3)
    backend.close()
    assert _steps(tmp_path / METRICS_FILE) == [0, 1, 2, 3]
    assert json.loads((tmp_path / METRICS_FILE).read_text().splitlines()[-1]) == {"step": 3, "m": 0.3}


def test_rewind_to_zero_empties_and_nothing_to_drop_leaves_the_file(tmp_path: Path):
    _write_rows(tmp_path / METRICS_FILE, [json.dumps({"step": s}) for s in (0, 1)])
    with Tracking("p", "e", backends=["file"], run_dir=tmp_path) as tracking:
        assert tracking.rewind(1) == 0
        assert _steps(tmp_path / METRICS_FILE) == [0, 1]
        assert tracking.rewind(0) == 2
    assert (tmp_path / METRICS_FILE).read_text() == ""
    assert Tracking("p", "e", backends=["console"], run_dir=tmp_path).rewind(3) == 0


def test_rewind_warns_about_rows_lost_before_logging(tmp_path: Path, caplog):
    _write_rows(tmp_path / METRICS_FILE, [json.dumps({"step": s}) for s in (1, 2, 5)])
    backend = FileBackend(tmp_path)
    with caplog.at_level("WARNING"):
        backend.rewind(5)
    backend.close()
    assert "no rows for steps 3-4" in caplog.text
