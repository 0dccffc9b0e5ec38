"""Shared fixtures of the scale-out tests: one Ray runtime per module, a tiny model, a tiny GSM8K run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from verl.testing.tiny import save_tiny_model
from verl.testing.workspace import make_gsm8k_workspace


@pytest.fixture(scope="module")
def ray_runtime():
    ray = pytest.importorskip("ray")
    from verl.controller.ray import init_ray

    init_ray({"num_cpus": 2})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", num_layers=2, hidden_size=32)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, model_dir) -> dict[str, Path]:
    """8 training and 4 test GSM8K questions, the tiny model and a text-dependent reward."""
    return make_gsm8k_workspace(
        tmp_path_factory.mktemp("scale_e2e"), train=8, test=4, max_question_chars=200, model=model_dir
    )


@pytest.fixture(scope="module")
def run_train(workspace) -> Callable[..., list[dict]]:
    """``run_train(run_dir, *overrides, steps=1, exit_code=0)``: `verl train` on the tiny workspace.

    Returns the rows of its metrics.jsonl (asserting the exit code first).
    """

    def run(run_dir: Path, *extra: str, steps: int = 1, exit_code: int = 0) -> list[dict]:
        from verl.cli.main import main as verl_main

        args = [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{workspace['train']}]",
            f"data.val_files=[{workspace['test']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=10",
            "data.train_batch_size=2",
            "data.val_batch_size=4",
            f"actor_rollout_ref.model.path={workspace['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            "actor_rollout_ref.actor.optim.lr=0.01",
            "actor_rollout_ref.rollout.n=2",
            f"custom_reward_function.path={workspace['reward']}",
            f"trainer.total_training_steps={steps}",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            *extra,
        ]
        assert verl_main(args) == exit_code
        if not (run_dir / "metrics.jsonl").exists():
            return []
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    return run
