"""`verl train` steps with the estimators/losses added for verl parity, on a tiny model (CPU, seconds).

Checks the wiring, not the maths (the unit tests pin that): gdpo reads compute_score's dict keys from the
batch, bypass_mode gets the rollout's log-probs and its config section, dppo and the vectorized estimators
run through the trainer and the actor loss.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    from verl.data.gsm8k import default_source_dir, prepare_gsm8k
    from verl.testing.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("new_names")
    src = root / "src"
    src.mkdir()
    for split in ("train", "test"):
        with gzip.open(default_source_dir() / f"{split}.jsonl.gz", "rt") as fh:
            rows = [line for line in fh if len(json.loads(line)["question"]) < 220][:4]
        (src / f"{split}.jsonl").write_text("".join(rows))
    files = prepare_gsm8k(root / "data", source_dir=src)
    reward = root / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    digits = sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))\n"
        "    spaces = solution_str.count(' ') / max(1, len(solution_str))\n"
        "    return {'score': digits + spaces, 'digits': digits, 'spaces': spaces}\n"
    )
    return {"root": root, "model": save_tiny_model(root / "tiny"), "reward": reward, **files}


def train(workspace, name: str, *overrides: str) -> list[dict]:
    from verl.cli.main import main as verl_main

    run_dir = workspace["root"] / name
    code = verl_main(
        [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{workspace['train']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=6",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={workspace['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.n=3",
            f"custom_reward_function.path={workspace['reward']}",
            "reward_model.num_workers=1",
            "trainer.total_training_steps=1",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            *overrides,
        ]
    )
    assert code == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_gdpo_with_bypass_mode_loss(workspace):
    rows = train(
        workspace,
        "gdpo_bypass",
        "algorithm.adv_estimator=gdpo",
        "algorithm.gdpo_reward_keys=[digits,spaces]",
        "algorithm.gdpo_reward_weights=[1.0,0.5]",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",
        # verl's apply_bypass_mode hands algorithm.rollout_correction to the loss
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
    )
    (row,) = rows
    assert math.isfinite(row["actor/pg_loss"])
    # the rollout and the trainer compute the same log-probs here: IS weights 1, KL 0
    assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
    assert abs(row["rollout_corr/kl"]) < 1e-3


@pytest.mark.parametrize(("estimator", "loss"), [("grpo_vectorized", "dppo_tv"), ("rloo_vectorized", "dppo_kl")])
def test_vectorized_estimators_with_dppo(workspace, estimator, loss):
    (row,) = train(
        workspace,
        f"{estimator}_{loss}",
        f"algorithm.adv_estimator={estimator}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}",
    )
    assert math.isfinite(row["actor/pg_loss"]) and 0.0 <= row["actor/pg_clipfrac"] <= 1.0
