"""The trainer's fast paths change no result: `verl train` with each of them on and off, step 1 compared.

* on-policy log-prob reuse (``actor.reuse_on_policy_log_prob``, default on): one optimizer step per batch,
  so the update's own detached log-probs are the old policy's; the separate old_log_prob pass is skipped;
* ``algorithm.rollout_correction.bypass_mode``: the rollout's log-probs are the old policy's;
* sequence packing (``model.use_remove_padding``, default on).

Step 1 samples the same responses in every variant (same seed, same weights), so its loss, gradient norm,
clip fraction and entropy must agree to float tolerance; only the stages that ran may differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace

COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("fast"), train=8, test=2)


def _step1(ws: dict[str, Path], name: str, *extra: str) -> dict:
    run_dir = ws["root"] / name
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        "data.val_files=null",
        "data.max_prompt_length=320",
        "data.max_response_length=10",
        "data.train_batch_size=4",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *extra,
    ]
    assert verl_main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["step"] == 1)


@pytest.fixture(scope="module")
def recompute(workspace) -> dict:
    return _step1(workspace, "recompute", "actor_rollout_ref.actor.reuse_on_policy_log_prob=false")


def _assert_same_update(row: dict, reference: dict) -> None:
    assert row["critic/score/mean"] == reference["critic/score/mean"]  # the same samples
    assert row["response_length/mean"] == reference["response_length/mean"]
    assert reference["actor/grad_norm"] > 0
    for key in COMPARED:
        assert row[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key


def test_on_policy_reuse_skips_the_old_log_prob_pass_and_changes_no_update(workspace, recompute):
    reuse = _step1(workspace, "reuse")  # the default
    assert "timing_s/old_log_prob" in recompute
    assert "timing_s/old_log_prob" not in reuse
    _assert_same_update(reuse, recompute)
    assert reuse["actor/ppo_kl"] == 0.0 and reuse["actor/pg_clipfrac"] == 0.0  # ratio exactly 1


def test_bypass_mode_uses_rollout_log_probs_and_changes_no_update(workspace, recompute):
    bypass = _step1(workspace, "bypass", "algorithm.rollout_correction.bypass_mode=true")
    assert "timing_s/old_log_prob" not in bypass
    _assert_same_update(bypass, recompute)


def test_padded_training_forward_gives_the_same_update(workspace, recompute):
    padded = _step1(
        workspace,
        "padded",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.actor.reuse_on_policy_log_prob=false",
    )
    _assert_same_update(padded, recompute)


def test_reuse_with_two_mini_batches_falls_back_to_recompute(workspace):
    row = _step1(workspace, "two_mini", "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    assert "timing_s/old_log_prob" in row  # off-policy second mini-batch: the old log-probs are recomputed


def test_bypass_mode_without_rollout_log_probs_is_a_config_error(workspace, capsys):
    args = [
        "config",
        "show",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=false",
    ]
    assert verl_main(args) != 0
    err = capsys.readouterr().err
    assert "algorithm.rollout_correction.bypass_mode" in err and "calculate_log_probs=true" in err
