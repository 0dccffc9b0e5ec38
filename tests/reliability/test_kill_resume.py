"""Crash-safe training: `verl train` killed with SIGKILL at a stage, or with a checkpoint save that fails, resumes
to exactly the run it would have been.

A tiny model on 4 GSM8K rows, batch 2 (2 steps per epoch), 4 steps, a checkpoint every step, validation at steps
0, 2 and 4. Each kill point runs as its own `python -m verl.cli.main train` process with ``VERL_FAULT_INJECT`` set
(the three start together); the resume is the same command without it. On CPU every metric and weight is
deterministic, so the resumed run must equal one uninterrupted run row for row (wall-clock keys aside) and weight
for weight. Kill points: the gen stage of step 2 (resume from step 1, mid-epoch 0), the actor update of step 3
(resume from step 2, the epoch boundary) and the write of checkpoint 4 (after its ``actor`` part, before the
rename and tracker: the last step must run again, from step 3, mid-epoch 1). Kills after a step's checkpoint and
row: in the validation of step 2 and of the last step, and in the final export; the rerun runs what is missing
(the validation, the export) and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from verl.cli.main import main as verl_main
from verl.testing.workspace import MACHINE_METRIC_PREFIXES, make_gsm8k_workspace
from verl.trainer.checkpoint import TRACKER_FILE

TOTAL_STEPS = 4
# case -> (VERL_FAULT_INJECT, the checkpoint the resume must load = the last complete one, extra overrides)
KILL_CASES = {
    "gen:2": ("gen:2", 1, ()),  # resume mid-epoch 0
    "update_actor:3": ("update_actor:3", 2, ()),  # resume at the epoch boundary (next batch: epoch 1's first)
    "checkpoint_write:4": ("checkpoint_write:4", 3, ()),  # resume mid-epoch 1; the last step runs again
    # checkpoints every 2 steps: step 3 was logged before the kill and runs again; its row must not double
    "gen:4,save_freq=2": ("gen:4", 2, ("trainer.save_freq=2",)),
}
AFTER_LAST_SAVE = "update_weights:4"  # checkpoint 4 published, killed before step 4's row and final_hf
# Killed after the step's checkpoint and its training row: in its validation, or in the export after the last step.
RUN_END_CASES = ("testing:2", "testing:4", "export:4")
CLOCK_KEYS = MACHINE_METRIC_PREFIXES


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("reliability"), train=4, test=2)


def _args(ws: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        f"data.val_files=[{ws['test']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        "data.val_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        f"trainer.total_training_steps={TOTAL_STEPS}",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "trainer.resume_mode=auto",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        *extra,
    ]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _strip_clock(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(CLOCK_KEYS)}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_hf" / "model.safetensors"))


def _batch_inputs(run_dir: Path, step: int) -> list[str]:
    lines = (run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()
    return [json.loads(line)["input"] for line in lines]


def _assert_same_run(run_dir: Path, full: Path) -> None:
    rows, expected = _rows(run_dir), _rows(full)
    assert [r["step"] for r in rows] == list(range(TOTAL_STEPS + 1))  # one row per step, none repeated
    assert [_strip_clock(r) for r in rows] == [_strip_clock(r) for r in expected]
    final, reference = _weights(run_dir), _weights(full)
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[k], reference[k]) for k in reference)
    for step in range(1, TOTAL_STEPS + 1):  # the sampler handed out the same prompts at every step (K19)
        assert _batch_inputs(run_dir, step) == _batch_inputs(full, step), step


def _listing(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir())


@pytest.fixture(scope="module")
def full_run(workspace) -> Path:
    run_dir = workspace["root"] / "uninterrupted"
    assert verl_main(_args(workspace, run_dir)) == 0
    return run_dir


@pytest.fixture(scope="module")
def killed(workspace, request) -> dict[str, dict]:
    """Start one `verl train` per kill point (all at once), run the uninterrupted run in here meanwhile, wait for
    each to die; what each left behind."""
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # same float reductions as in here
    started: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    try:
        more = {case: (case, 0, ()) for case in (AFTER_LAST_SAVE, *RUN_END_CASES)}
        for case, (point, _, extra) in {**KILL_CASES, **more}.items():
            run_dir = workspace["root"] / f"killed_{len(started)}"
            cmd = [sys.executable, "-m", "verl.cli.main", *_args(workspace, run_dir, *extra)]
            proc = subprocess.Popen(
                cmd,
                env={**env, "VERL_FAULT_INJECT": point},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            started[case] = (proc, run_dir, time.monotonic())
        request.getfixturevalue("full_run")
        result = {}
        for case, (proc, run_dir, t0) in started.items():
            output, _ = proc.communicate(timeout=300)
            ckpt = run_dir / "ckpt"
            result[case] = {
                "returncode": proc.returncode,
                "output": output,
                "run_dir": run_dir,
                "seconds": time.monotonic() - t0,
                "listing": _listing(ckpt) if ckpt.is_dir() else [],
                "tracker": (ckpt / TRACKER_FILE).read_text() if (ckpt / TRACKER_FILE).exists() else None,
                "steps_logged": [r["step"] for r in _rows(run_dir)],
            }
        return result
    finally:
        for proc, _, _ in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.parametrize("case", list(KILL_CASES))
def test_sigkill_then_resume_equals_uninterrupted_run(case, killed, workspace, full_run, caplog, monkeypatch):
    monkeypatch.delenv("VERL_FAULT_INJECT", raising=False)
    point, saved, extra = KILL_CASES[case]
    stage, step = point.split(":")[0], int(point.split(":")[1])
    crash = killed[case]
    assert crash["returncode"] == -signal.SIGKILL, crash["output"][-3000:]
    # The killed step logged nothing; every earlier step did, and its checkpoint is complete and tracked.
    assert crash["steps_logged"] == list(range(step))
    assert crash["tracker"] == str(saved)
    freq = 2 if extra else 1
    complete = [f"global_step_{s}" for s in range(freq, saved + 1, freq)]
    scratch = [name for name in crash["listing"] if ".tmp-" in name]
    assert [n for n in crash["listing"] if n.startswith("global_step_") and ".tmp-" not in n] == complete
    if stage == "checkpoint_write":
        # Killed mid-write: a temp folder holds the first part only (no data.json / trainer_state.json yet).
        assert len(scratch) == 1 and scratch[0].startswith(f"global_step_{step}.tmp-")
        assert _listing(crash["run_dir"] / "ckpt" / scratch[0]) == ["actor"]
    else:
        assert scratch == []

    run_dir = crash["run_dir"]
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    assert verl_main(_args(workspace, run_dir, *extra)) == 0  # the same command, without the hook
    crash["resume_seconds"] = time.monotonic() - t0
    ckpt = run_dir / "ckpt"
    assert f"resumed from {ckpt / f'global_step_{saved}'} (step {saved})" in caplog.text
    saves = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved checkpoint")]
    # Only the steps after the last complete checkpoint ran again (with save_freq=1: the step in flight); the
    # partial checkpoint was never loaded.
    expected_saves = range(saved + freq, TOTAL_STEPS + 1, freq)
    assert saves == [f"saved checkpoint {ckpt / f'global_step_{s}'}" for s in expected_saves]
    if scratch:
        assert "removed stale checkpoint scratch folder" in caplog.text
    assert _listing(ckpt) == [f"global_step_{s}" for s in range(freq, TOTAL_STEPS + 1, freq)] + [TRACKER_FILE]
    assert (ckpt / TRACKER_FILE).read_text() == str(TOTAL_STEPS)
    if saved < step - 1:
        assert f"dropped {step - 1 - saved} rows after step {saved}" in caplog.text
    _assert_same_run(run_dir, full_run)


def test_failed_checkpoint_save_stops_keeps_previous_then_resumes(workspace, full_run, monkeypatch, capsys):
    """The disk refuses checkpoint 2 (ENOSPC): exit 1 naming the path and the OS error; global_step_1 (keep=1)
    survives as the tracked checkpoint; the rerun resumes from it and ends as the uninterrupted run."""
    run_dir = workspace["root"] / "disk_full"
    args = _args(workspace, run_dir, "trainer.max_actor_ckpt_to_keep=1")
    monkeypatch.setenv("VERL_FAULT_INJECT", "checkpoint_write:2:oserror")
    assert verl_main(args) == 1
    err = capsys.readouterr().err
    ckpt = run_dir / "ckpt"
    assert f"saving checkpoint {ckpt / 'global_step_2'} failed" in err
    assert "No space left on device" in err and "Traceback" not in err
    assert f"last complete checkpoint: {ckpt / 'global_step_1'} (step 1)" in err
    assert _listing(ckpt) == ["global_step_1", TRACKER_FILE]  # no half folder; keep=1 did not delete step 1
    assert (ckpt / TRACKER_FILE).read_text() == "1"
    assert [r["step"] for r in _rows(run_dir)] == [0, 1]
    monkeypatch.delenv("VERL_FAULT_INJECT")
    assert verl_main(args) == 0
    assert _listing(ckpt) == [f"global_step_{TOTAL_STEPS}", TRACKER_FILE]  # rotated only after each new save
    _assert_same_run(run_dir, full_run)


def test_resume_after_the_last_step_reports_already_finished(workspace, full_run, capsys):
    """Both ways of ending a run: a step count (known from the tracker alone) and epochs (the trainer resumes)."""
    before = (full_run / "metrics.jsonl").read_bytes()
    weights = (full_run / "final_hf" / "model.safetensors").stat().st_mtime_ns
    by_epochs = ("trainer.total_training_steps=null", "trainer.total_epochs=2")  # 2 epochs x 2 batches = 4 steps
    for extra in ((), by_epochs):
        assert verl_main(_args(workspace, full_run, *extra)) == 0
        assert f"already finished ({TOTAL_STEPS}/{TOTAL_STEPS} steps" in capsys.readouterr().out
    assert (full_run / "metrics.jsonl").read_bytes() == before  # no step ran, no row was written or dropped
    assert (full_run / "final_hf" / "model.safetensors").stat().st_mtime_ns == weights
    assert (full_run / "ckpt" / TRACKER_FILE).read_text() == str(TOTAL_STEPS)


def test_killed_after_the_last_checkpoint_rerun_validates_and_exports(killed, workspace, full_run, capsys):
    """Killed after checkpoint 4 was published but before its row and final_hf were written: the run is not
    finished. The rerun trains nothing, runs step 4's validation (its row then holds the uninterrupted run's
    validation metrics; the training metrics of step 4 are lost: the window between a checkpoint and its row)
    and writes final_hf from checkpoint 4, the uninterrupted run's weights."""
    crash = killed[AFTER_LAST_SAVE]
    assert crash["returncode"] == -signal.SIGKILL, crash["output"][-3000:]
    assert crash["tracker"] == str(TOTAL_STEPS) and crash["steps_logged"] == [0, 1, 2, 3]
    run_dir = crash["run_dir"]
    assert not (run_dir / "final_hf").exists()
    assert verl_main(_args(workspace, run_dir)) == 0
    out = capsys.readouterr().out
    assert "already finished" not in out and "its training metrics are lost" in out, out
    assert "final actor (HF folder) was missing" in out
    final, reference = _weights(run_dir), _weights(full_run)
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in reference)
    rows, expected = _rows(run_dir), _rows(full_run)
    assert [_strip_clock(r) for r in rows[:TOTAL_STEPS]] == [_strip_clock(r) for r in expected[:TOTAL_STEPS]]
    validation = {k: v for k, v in expected[TOTAL_STEPS].items() if k == "step" or k.startswith("val-")}
    assert _strip_clock(rows[TOTAL_STEPS]) == validation and "timing_s/testing" in rows[TOTAL_STEPS]
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("final_hf")) == ["final_hf"]
    assert verl_main(_args(workspace, run_dir)) == 0  # now it is finished
    assert "already finished (4/4 steps" in capsys.readouterr().out


@pytest.mark.parametrize("case", RUN_END_CASES)
def test_killed_in_validation_or_export_rerun_runs_what_is_missing(case, killed, workspace, full_run, capsys, caplog):
    """The step's training row was on disk before its validation (or the export) started, so the kill costs
    neither the row nor the step: the rerun resumes from that step's checkpoint, runs its validation (merged into
    the row) or only the export, trains nothing twice, and ends as the uninterrupted run."""
    stage, step = case.split(":")[0], int(case.split(":")[1])
    crash = killed[case]
    assert crash["returncode"] == -signal.SIGKILL, crash["output"][-3000:]
    assert crash["tracker"] == str(step) and crash["steps_logged"] == list(range(step + 1))
    run_dir = crash["run_dir"]
    last = _rows(run_dir)[-1]
    assert ("timing_s/testing" in last) == (stage == "export"), last.keys()  # validation merged only if it ran
    assert "critic/score/mean" in last  # the step's training metrics are there either way
    caplog.set_level(logging.INFO)
    assert verl_main(_args(workspace, run_dir)) == 0
    out = capsys.readouterr().out
    saves = [r.getMessage() for r in caplog.records if r.getMessage().startswith("saved checkpoint")]
    assert saves == [f"saved checkpoint {run_dir / 'ckpt' / f'global_step_{s}'}" for s in range(step + 1, 5)]
    if stage == "export":
        assert "already finished (4/4 steps" in out and "final actor (HF folder) was missing" in out
    else:
        assert f"step {step} has its checkpoint but its row in metrics.jsonl lacks the validation" in out, out
        assert "already finished" not in out
    _assert_same_run(run_dir, full_run)
