"""The main job (``verl train``: GRPO on GSM8K with SmolLM2-135M) with the SGLang rollout, on a CUDA GPU.

Switching engines is one override, ``actor_rollout_ref.rollout.name=sglang``. Three training steps with a small
batch and validation on 8 test questions at the end. Marked ``gpu`` and ``slow``; ``scripts/check_cuda.sh`` runs
it. Skipped where there is no CUDA GPU or no SGLang kernel package.
"""

from __future__ import annotations

import json
import math

import pytest
import torch


def _why_not() -> str | None:
    from verl_sglang.backend import sglang_available

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    usable = sglang_available()
    return None if usable is True else usable


pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def test_three_grpo_steps_with_sglang_rollout(tmp_path):
    from verl.cli.main import main as verl_main

    run_dir = tmp_path / "run"
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        "actor_rollout_ref.rollout.name=sglang",
        "trainer.device=cuda",
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "trainer.total_training_steps=3",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
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
    assert all(r["response_length/mean"] > 5 for r in steps)  # real generations, not empty rows
    assert any(k.startswith("val-core/openai/gsm8k/") for k in rows[-1] | steps[-1])
    assert "name: sglang" in (run_dir / "config.yaml").read_text()
