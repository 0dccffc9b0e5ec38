"""verl's decoupled rollout correction through `verl train`: one tiny GRPO step with token IS and token_k1 RS.

The hf rollout shares the actor's fp32 module, so the rollout's log-probs equal the recomputed old policy's to
about 1e-6: the weights are 1, nothing is rejected and the KL is 0. What this pins is the wiring: rollout_is
forces the old_log_prob pass (the on-policy fast path has no old policy to compare), the trainer logs verl's
rollout_corr/* metrics, and the step trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("rollout_corr"), train=4, test=2)


def test_token_is_with_rejection_logs_rollout_corr_metrics(workspace):
    ws = workspace
    run_dir = ws["root"] / "run"
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        "data.val_files=null",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
    ]
    assert verl_main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["step"] == 1)
    assert "timing_s/old_log_prob" in row  # the default on-policy reuse would skip it; correction needs it
    for key in (
        "rollout_is_mean",
        "rollout_is_std",
        "rollout_is_eff_sample_size",
        "rollout_is_ratio_fraction_high",
        "rollout_rs_token_k1_mean",
        "rollout_rs_masked_fraction",
        "rollout_rs_seq_masked_fraction",
        "kl",
        "k3_kl",
        "training_ppl",
        "rollout_ppl",
        "chi2_token",
        "chi2_seq",
    ):
        assert f"rollout_corr/{key}" in row, key
    assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
    assert row["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
    assert row["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    assert abs(row["rollout_corr/kl"]) < 1e-4
    assert row["rollout_corr/training_ppl"] == pytest.approx(row["rollout_corr/rollout_ppl"], rel=1e-4)
    assert row["actor/grad_norm"] > 0
