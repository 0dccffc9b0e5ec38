"""The main job on the session's device: ``verl train`` of GRPO, ``VERL_TEST_STEPS`` steps, the combination's engines.

A tiny Llama (:func:`verl.testing.tiny.save_tiny_model`, which vLLM loads too) on a few real GSM8K rows, one
worker, ``trainer.device=<platform>``: what it checks is that the engines run on the device together (rollout,
log-probs, update, weight sync), not what they learn. Run by the device sessions of the nox matrix.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path


def test_main_job_trains_on_the_device(tmp_path: Path, matrix, device_platform) -> None:
    from verl.testing.workspace import make_gsm8k_workspace

    ws = make_gsm8k_workspace(tmp_path / "ws", train=2 * matrix.steps, test=2)
    run_dir = tmp_path / "run"
    argv = [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        f"data.val_files=[{ws['test']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=16",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.n=2",
        f"actor_rollout_ref.actor.strategy={matrix.training}",
        f"actor_rollout_ref.rollout.name={matrix.rollout}",
        f"custom_reward_function.path={ws['reward']}",
        f"trainer.device={matrix.device}",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={matrix.steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console,file]",
    ]
    done = subprocess.run([sys.executable, "-m", "verl.cli.main", *argv], capture_output=True, text=True, timeout=480)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert f"verl train: done, {matrix.steps} steps" in output
    assert f"verl train: platform: {matrix.device} (device type {device_platform.device_type})" in output
    assert f"verl train: actor: training engine {matrix.training} [" in output
    assert f"verl train: rollout: rollout engine {matrix.rollout} [" in output

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == list(range(1, matrix.steps + 1))
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
        assert all(math.isfinite(r[key]) for r in steps), key
    saved = (run_dir / "config.yaml").read_text()
    for line in (f"device: {matrix.device}", f"strategy: {matrix.training}", f"name: {matrix.rollout}"):
        assert line in saved, line
    if device_platform.device_type != "cpu":
        # The run really used the device: its peak device memory is not zero (it is on a CPU-only fallback).
        assert max(r["perf/max_memory_allocated_gb"] for r in steps) > 0
