"""Clean stops: SIGINT (Ctrl-C) and SIGTERM end `verl train` with one line and 128 + signal, no traceback, the last
checkpoint intact and the workers gone; the same command then resumes to exactly the uninterrupted run.

A tiny model on 4 GSM8K rows, batch 2, 4 steps, a checkpoint every step, validation at steps 0, 2 and 4, a
custom reward scored in worker processes. Each case is a real `python -m verl.cli.main train` process. The
signal is placed with ``VERL_FAULT_INJECT=<stage>:<step>:sigint|sigterm`` (the process signals itself at that
point, as a signal arriving then would): at a step boundary (the start of step 3), mid-step (step 3's actor
update) and mid-save (inside checkpoint 2's write: the save completes and the step's row is logged before the
stop). One more case is a real Ctrl-C: SIGINT to the whole process group once step 1 is logged.
"""

from __future__ import annotations

import json
import os
import re
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
# case -> (VERL_FAULT_INJECT, exit status, last complete step = checkpoint resumed from, steps logged)
CASES = {
    "boundary_sigint": ("gen:3:sigint", 130, 2, [0, 1, 2]),
    "mid_step_sigterm": ("update_actor:3:sigterm", 143, 2, [0, 1, 2]),
    "mid_save_sigterm": ("checkpoint_write:2:sigterm", 143, 2, [0, 1, 2]),
}
CTRL_C = "ctrl_c_to_the_group"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("clean_stop"), train=4, test=2)


def _args(ws: dict[str, Path], run_dir: Path) -> list[str]:
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
        "reward_model.num_workers=2",  # worker processes (custom reward: process isolation)
        f"trainer.total_training_steps={TOTAL_STEPS}",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.val_before_train=true",
        "trainer.test_freq=2",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
    ]


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _run_metrics(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(MACHINE_METRIC_PREFIXES)} for r in rows]


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (the reward workers of a trainer)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _start(ws: dict[str, Path], run_dir: Path, fault: str | None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # same float reductions as in here
    env.pop("VERL_FAULT_INJECT", None)
    if fault:
        env["VERL_FAULT_INJECT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "verl.cli.main", *_args(ws, run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal job: the Ctrl-C case signals the group
    )


def _ctrl_c_after_step_1(proc: subprocess.Popen, run_dir: Path) -> set[int]:
    """Wait for step 1's row, note the trainer's child processes, SIGINT the whole group; returns the children."""
    deadline = time.monotonic() + 240
    while not any(r["step"] == 1 for r in _rows(run_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 1 was logged"
        time.sleep(0.05)
    children = _children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    return children


@pytest.fixture(scope="module")
def stopped(workspace, request) -> dict[str, dict]:
    """Start every case at once, run the uninterrupted run in here meanwhile, collect what each left."""
    started = {case: _start(workspace, workspace["root"] / case, fault) for case, (fault, *_) in CASES.items()}
    started[CTRL_C] = _start(workspace, workspace["root"] / CTRL_C, None)
    result: dict[str, dict] = {}
    try:
        children = _ctrl_c_after_step_1(started[CTRL_C], workspace["root"] / CTRL_C)
        request.getfixturevalue("full_run")
        for case, proc in started.items():
            output, _ = proc.communicate(timeout=300)
            result[case] = {"returncode": proc.returncode, "output": output, "pid": proc.pid}
        result[CTRL_C]["children"] = children
        return result
    finally:
        for proc in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def full_run(workspace) -> Path:
    run_dir = workspace["root"] / "uninterrupted"
    assert verl_main(_args(workspace, run_dir)) == 0
    return run_dir


def _assert_resumes_to_the_uninterrupted_run(workspace, run_dir: Path, full_run: Path, saved: int, capsys) -> None:
    assert verl_main(_args(workspace, run_dir)) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    rows, expected = _rows(run_dir), _rows(full_run)
    assert [r["step"] for r in rows] == list(range(TOTAL_STEPS + 1))
    assert _run_metrics(rows) == _run_metrics(expected)
    from safetensors.torch import load_file

    final = load_file(str(run_dir / "final_hf" / "model.safetensors"))
    reference = load_file(str(full_run / "final_hf" / "model.safetensors"))
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in reference)
    assert (run_dir / "ckpt" / TRACKER_FILE).read_text() == str(TOTAL_STEPS)
    assert saved < TOTAL_STEPS


@pytest.mark.parametrize("case", list(CASES))
def test_signal_stops_cleanly_then_the_rerun_resumes(case, stopped, workspace, full_run, capsys, monkeypatch):
    monkeypatch.delenv("VERL_FAULT_INJECT", raising=False)
    fault, status, saved, logged = CASES[case]
    run = stopped[case]
    output, run_dir = run["output"], workspace["root"] / case
    name = "SIGINT" if fault.endswith("sigint") else "SIGTERM"
    ckpt = run_dir / "ckpt"
    assert run["returncode"] == status, output[-3000:]
    line = f"verl train: {name}: stopped at step {saved}; rerun to resume from {ckpt / f'global_step_{saved}'} (step {saved})"
    assert line in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    # The last checkpoint is complete and tracked; no temp folder is left; every completed step has its row.
    assert sorted(p.name for p in ckpt.iterdir()) == [f"global_step_{s}" for s in range(1, saved + 1)] + [TRACKER_FILE]
    assert (ckpt / TRACKER_FILE).read_text() == str(saved)
    assert [r["step"] for r in _rows(run_dir)] == logged
    assert not (run_dir / "final_hf").exists()
    if case == "mid_save_sigterm":
        # The signal came inside checkpoint 2's write: the save completed and step 2's row was logged first; the
        # validation due at step 2 did not run, so the resume runs it before step 3.
        assert "SIGTERM received; stopping once checkpoint global_step_2 is saved and its step logged" in output
        assert "timing_s/testing" not in _rows(run_dir)[-1]
    _assert_resumes_to_the_uninterrupted_run(workspace, run_dir, full_run, saved, capsys)


def test_ctrl_c_to_the_process_group(stopped, workspace, full_run, capsys, monkeypatch):
    """A terminal's Ctrl-C reaches every process of the job: the trainer stops cleanly, the reward worker
    processes (their own sessions, SIGINT ignored) are shut down by it, nothing prints a traceback."""
    monkeypatch.delenv("VERL_FAULT_INJECT", raising=False)
    run = stopped[CTRL_C]
    output, run_dir = run["output"], workspace["root"] / CTRL_C
    assert run["returncode"] == 130, output[-3000:]
    match = re.search(r"verl train: SIGINT: stopped at step (\d+); rerun to resume from (\S+) \(step (\d+)\)", output)
    assert match, output[-3000:]
    step, saved = int(match.group(1)), int(match.group(3))
    assert 1 <= saved == step < TOTAL_STEPS  # a checkpoint every step: the resume point is the last step done
    assert match.group(2) == str(run_dir / "ckpt" / f"global_step_{saved}")
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert len(run["children"]) >= 2, "the reward worker processes were not found"
    assert not [pid for pid in run["children"] if _alive(pid)], "worker processes outlived the trainer"
    _assert_resumes_to_the_uninterrupted_run(workspace, run_dir, full_run, saved, capsys)
