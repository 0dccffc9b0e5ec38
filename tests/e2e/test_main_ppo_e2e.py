"""`python -m verl.trainer.main_ppo` with verl-style overrides: a real one-step run from verl's defaults.

hydra.run.dir is the run folder (config.yaml, metrics.jsonl, final_hf/) while the checkpoints stay at verl's
trainer.default_local_dir (checkpoints/<project>/<experiment> under the working directory), as in verl.
A tiny model, about half a minute on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from verl.testing.workspace import DIGIT_SHARE_REWARD, make_gsm8k_workspace


def test_main_ppo_runs_one_step_from_verls_defaults(tmp_path: Path) -> None:
    ws = make_gsm8k_workspace(tmp_path / "ws", train=4, test=2, reward_source=DIGIT_SHARE_REWARD)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run_dir = tmp_path / "hydra_out"
    argv = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files=['{ws['train']}']",
        f"data.val_files=['{ws['test']}']",
        "data.train_batch_size=2",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "+actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.logger=[console,file]",
        "trainer.project_name=p",
        "trainer.experiment_name=e",
        f"hydra.run.dir={run_dir}",
        "hydra.job.chdir=False",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "base config: ppo_trainer" in proc.stdout
    assert "note: hydra.run.dir=" in proc.stderr and "note: hydra.job.chdir=False: dropped" in proc.stderr
    config = (run_dir / "config.yaml").read_text()
    assert config.splitlines()[0].startswith("# base config: ppo_trainer")
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1]
    assert (run_dir / "final_hf").is_dir()
    # verl's checkpoint folder, relative to the working directory, not under the Hydra run folder.
    assert (cwd / "checkpoints" / "p" / "e" / "global_step_1").is_dir()
    assert not (run_dir / "checkpoints").exists()
