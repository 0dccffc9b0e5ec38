"""The main job (`verl train`, default config: GRPO on GSM8K with SmolLM2-135M) with the vLLM rollout.

Switching engines is one override, ``actor_rollout_ref.rollout.name=vllm``. Three training steps with a
smaller batch and validation on 8 test questions at the end, so it stays within a few minutes on 2 cores.
Marked ``slow``: the ``plugin(vllm)`` nox session runs it, quick local runs can deselect it.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]


def test_three_grpo_steps_with_vllm_rollout(tmp_path):
    from verl.cli.main import main as verl_main

    run_dir = tmp_path / "run"
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        "actor_rollout_ref.rollout.name=vllm",
        "trainer.total_training_steps=3",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "data.val_batch_size=8",
        "data.val_max_samples=8",
        "trainer.val_before_train=false",
        "trainer.test_freq=3",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
        f"trainer.validation_data_dir={tmp_path / 'validation'}",
    ]
    assert verl_main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean", "timing_s/gen"):
        assert all(math.isfinite(r[key]) for r in steps), key
    # Responses are real generations (SmolLM2 answers with tens of tokens), not empty rows.
    assert all(r["response_length/mean"] > 5 for r in steps)
    assert any(k.startswith("val-core/openai/gsm8k/") for k in rows[-1] | steps[-1])
    # The rollout engine really was vLLM: the resolved config saved beside the run says so.
    assert "name: vllm" in (run_dir / "config.yaml").read_text()
