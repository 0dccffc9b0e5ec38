"""SIGTERM to a `verl train` on Ray actors: the one stop line, exit 143, and no Ray process left behind.

A real `python -m verl.cli.main train` with ``trainer.controller=ray`` (its own local Ray cluster: GCS, raylet,
the actor's worker process) in a session of its own; the signal arrives mid-step through
``VERL_FAULT_INJECT=update_actor:2:sigterm``. After it exits, no process of that session may remain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.multiprocess


def _session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, name) of the live processes in session ``sid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append((int(stat.parent.name), name))
    return found


def test_sigterm_stops_a_ray_run_and_its_ray_processes(workspace, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "verl.cli.main",
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{workspace['train']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=10",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={workspace['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={workspace['reward']}",
        "trainer.controller=ray",
        "+ray_kwargs.ray_init.num_cpus=2",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
    ]
    env = {**os.environ, "VERL_FAULT_INJECT": "update_actor:2:sigterm", "RAY_ADDRESS": "local"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 143, output[-4000:]
        ckpt = run_dir / "ckpt"
        line = f"verl train: SIGTERM: stopped at step 1; rerun to resume from {ckpt / 'global_step_1'} (step 1)"
        assert line in output, output[-4000:]
        assert "Traceback" not in output, output[-4000:]
        deadline = time.monotonic() + 30  # Ray's own shutdown of its daemons may take a moment after the exit
        while (left := _session_members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == [], f"processes of the run outlived it: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid, _ in _session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
