"""End-to-end GRPO with a tiny model on real GSM8K rows: `verl train` as a user runs it.

Three steps, a handful of rows, well under a minute. A reward that depends on the sampled
text (share of a character) makes advantages non-zero even for a random tiny model, so
the weights really move. The resume test checks CPU determinism: a run resumed from the
step-2 checkpoint reproduces step 3 of an uninterrupted run exactly.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace, run_metrics


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    # 24 short training questions and 4 test questions from the shipped GSM8K files.
    return make_gsm8k_workspace(tmp_path_factory.mktemp("e2e"), train=24, test=4)


def _args(ws: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        f"data.val_files=[{ws['test']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=12",
        "data.train_batch_size=2",
        "data.val_batch_size=4",
        "data.val_max_samples=4",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.test_freq=3",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *extra,
    ]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _strip_timing(row: dict) -> dict:
    """Drop wall-clock and memory measurements; every other metric is deterministic on CPU."""
    return run_metrics(row)


@pytest.fixture(scope="module")
def full_run(workspace) -> Path:
    run_dir = workspace["root"] / "run_a"
    assert verl_main(_args(workspace, run_dir, f"trainer.rollout_data_dir={run_dir / 'rollouts'}")) == 0
    return run_dir


def test_three_steps_train_log_and_checkpoint(workspace, full_run):
    rows = _metrics(full_run)
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in (
        "critic/score/mean",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "response_length/mean",
        "timing_s/gen",
        "timing_s/update_actor",
        "perf/throughput",
    ):
        assert key in steps[0], key
        assert all(math.isfinite(r[key]) for r in steps), key
    # Validation before training (step 0) and at the last step.
    assert any(k.startswith("val-core/openai/gsm8k/") for k in rows[0])
    assert any(k.startswith("val-core/openai/gsm8k/") for k in steps[-1])
    ckpt = full_run / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert (ckpt / "global_step_3" / "actor").is_dir()
    # The final actor is a HF folder that transformers loads, and its weights moved.
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(full_run / "final_hf")
    start = AutoModelForCausalLM.from_pretrained(workspace["model"])
    moved = [
        not torch.equal(a, b) for a, b in zip(final.state_dict().values(), start.state_dict().values(), strict=True)
    ]
    assert any(moved)
    assert (full_run / "config.yaml").exists()


def test_every_step_switches_the_hybrid_engine_and_logs_memory(full_run):
    """The mode switches run every step (a no-op here: the hf rollout shares the reference trainer's module on
    CPU), each timed; memory per phase comes from the platform (RSS on CPU)."""
    steps = [r for r in _metrics(full_run) if r["step"] > 0]
    for row in steps:
        for key in ("sleep", "onload", "wake_up", "update_weights", "offload"):
            assert row[f"timing_s/{key}"] >= 0, key
        assert row["weight_sync/shared"] == 1.0 and row["weight_sync/tensors"] == 0  # same module: nothing moved
        for phase in ("gen", "train", "update_weights"):
            assert row[f"memory/{phase}/peak_allocated_gb"] > 0.1, phase  # a python process with torch: > 100 MB
        assert row["perf/max_memory_allocated_gb"] == max(
            row[f"memory/{phase}/peak_allocated_gb"] for phase in ("gen", "train", "update_weights")
        )
        assert 0 < row["perf/cpu_memory_used_gb"] < 1024
        assert row["memory/sleep/allocated_after_gb"] > 0


def test_verl_export_of_the_last_checkpoint_equals_the_final_actor(full_run, tmp_path, capsys):
    from safetensors.torch import load_file

    step3 = full_run / "ckpt" / "global_step_3"
    info = json.loads((step3 / "actor" / "checkpoint.json").read_text())
    assert info == {"strategy": "reference", "world_size": 1}
    assert verl_main(["export", str(step3), str(tmp_path / "hf")]) == 0
    assert "verl export:" in capsys.readouterr().out
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    final = load_file(str(full_run / "final_hf" / "model.safetensors"))
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[k], final[k]) for k in final)
    assert (tmp_path / "hf" / "tokenizer_config.json").is_file()
    # Step 2's checkpoint is another model (the export really reads the checkpoint).
    assert verl_main(["export", str(full_run / "ckpt" / "global_step_2" / "actor"), str(tmp_path / "hf2")]) == 0
    older = load_file(str(tmp_path / "hf2" / "model.safetensors"))
    assert any(not torch.equal(older[k], final[k]) for k in final)


def test_verl_export_names_what_is_missing(tmp_path, capsys):
    (tmp_path / "actor").mkdir()
    assert verl_main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "pass --strategy" in capsys.readouterr().err
    assert verl_main(["export", str(tmp_path), str(tmp_path / "out"), "--strategy", "reference"]) == 2
    assert "pass --hf-source" in capsys.readouterr().err


def test_rollout_dump_matches_logged_scores(full_run):
    for row in (r for r in _metrics(full_run) if r["step"] > 0):
        samples = [json.loads(x) for x in (full_run / "rollouts" / f"{row['step']}.jsonl").read_text().splitlines()]
        assert len(samples) == 4  # 2 prompts x n=2
        scores = [s["score"] for s in samples]
        assert sum(scores) / len(scores) == pytest.approx(row["critic/score/mean"], abs=1e-6)
        assert len({s["uid"] for s in samples}) == 2


def test_resume_from_step_2_reproduces_step_3(workspace, full_run):
    run_dir = workspace["root"] / "run_b"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(full_run / "ckpt" / "global_step_2", ckpt / "global_step_2")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    assert verl_main(_args(workspace, run_dir, "trainer.resume_mode=auto")) == 0
    resumed = [r for r in _metrics(run_dir) if r["step"] > 0]
    assert [r["step"] for r in resumed] == [3]
    expected = next(r for r in _metrics(full_run) if r["step"] == 3)
    assert _strip_timing(resumed[0]) == _strip_timing(expected)


def test_finished_run_reports_already_finished(workspace, full_run, capsys):
    assert verl_main(_args(workspace, full_run, "trainer.resume_mode=auto")) == 0
    assert "already finished" in capsys.readouterr().out


def test_val_only_validates_a_checkpoint_and_trains_nothing(workspace, full_run, capsys):
    """trainer.val_only on a folder holding the step-3 checkpoint: one validation of those weights, logged at
    step 3 with the values the uninterrupted run logged there, no training row, no new checkpoint or export."""
    run_dir = workspace["root"] / "run_val_only"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(full_run / "ckpt" / "global_step_3", ckpt / "global_step_3")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    assert verl_main(_args(workspace, run_dir, "trainer.val_only=true")) == 0
    assert "validation only (trainer.val_only) at step 3" in capsys.readouterr().out
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [3]
    assert not any(k.startswith(("actor/", "critic/")) for k in rows[0])
    expected = next(r for r in _metrics(full_run) if r["step"] == 3)
    val = {k: v for k, v in rows[0].items() if k.startswith("val-")}
    assert val and val == {k: expected[k] for k in val}
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_3", "latest_checkpointed_iteration.txt"]
    assert not (run_dir / "final_hf").exists()


def test_val_only_without_val_before_train_is_refused(workspace, tmp_path, capsys):
    args = _args(workspace, tmp_path / "run", "trainer.val_only=true", "trainer.val_before_train=false")
    assert verl_main(args) == 2
    err = capsys.readouterr().err
    assert "trainer.val_only" in err and "val_before_train=true" in err


@pytest.mark.parametrize(
    "estimator",
    ["rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk"],
)
def test_every_critic_free_estimator_runs_a_step(workspace, estimator):
    run_dir = workspace["root"] / f"est_{estimator}"
    args = _args(workspace, run_dir, f"algorithm.adv_estimator={estimator}", "trainer.total_training_steps=1")
    args += ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]
    assert verl_main(args) == 0
    (row,) = _metrics(run_dir)
    assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["critic/advantages/mean"])
    if estimator == "remax":
        assert "timing_s/gen_max" in row


GAE_ARGS = ("algorithm.adv_estimator=gae", "critic.optim.lr=0.01", "trainer.critic_warmup=1")


@pytest.fixture(scope="module")
def gae_run(workspace) -> Path:
    run_dir = workspace["root"] / "gae"
    assert verl_main(_args(workspace, run_dir, *GAE_ARGS)) == 0
    return run_dir


def test_gae_trains_a_critic_with_warmup_metrics_and_checkpoints(gae_run):
    steps = [r for r in _metrics(gae_run) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in (
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/lr",
        "critic/values/mean",
        "critic/returns/mean",
        "critic/vf_explained_var",
        "timing_s/values",
        "timing_s/update_critic",
    ):
        assert all(math.isfinite(r[key]) for r in steps), key
    # trainer.critic_warmup=1: step 1 trains only the critic.
    assert "actor/pg_loss" not in steps[0] and "timing_s/update_actor" not in steps[0]
    assert all("actor/pg_loss" in r for r in steps[1:])
    assert all(r["critic/lr"] == 0.01 for r in steps)
    # The values the critic predicts change from step to step (it is trained).
    assert len({r["critic/values/mean"] for r in steps}) == 3
    for step in (1, 2, 3):
        assert (gae_run / "ckpt" / f"global_step_{step}" / "critic" / "model_world_size_1_rank_0.safetensors").is_file()


def test_gae_resume_restores_the_critic_and_reproduces_step_3(workspace, gae_run):
    run_dir = workspace["root"] / "gae_resumed"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(gae_run / "ckpt" / "global_step_2", ckpt / "global_step_2")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    assert verl_main(_args(workspace, run_dir, *GAE_ARGS, "trainer.resume_mode=auto")) == 0
    (resumed,) = [r for r in _metrics(run_dir) if r["step"] > 0]
    expected = next(r for r in _metrics(gae_run) if r["step"] == 3)
    assert {k: v for k, v in _strip_timing(resumed).items()} == {k: v for k, v in _strip_timing(expected).items()}


def test_reward_model_scores_are_added_to_the_rule_reward(workspace, tmp_path):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from verl.testing.tiny import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    torch.manual_seed(5)
    rm_cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForSequenceClassification(rm_cfg).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    runs = {}
    for combine in ("replace", "sum"):
        run_dir = workspace["root"] / f"rm_{combine}"
        args = _args(workspace, run_dir, "trainer.total_training_steps=1", f"trainer.rollout_data_dir={run_dir / 'r'}")
        args += ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]
        args += ["reward_model.enable=true", f"reward_model.model.path={tmp_path / 'rm'}"]
        assert verl_main([*args, f"reward_model.combine={combine}"]) == 0
        (row,) = _metrics(run_dir)
        assert "timing_s/rm" in row and math.isfinite(row["critic/score/mean"])
        runs[combine] = [json.loads(x)["score"] for x in (run_dir / "r" / "1.jsonl").read_text().splitlines()]
    # Same seed, same rollout: sum - replace is the rule score (share of digits, in [0, 1]).
    rule = [s - r for s, r in zip(runs["sum"], runs["replace"], strict=True)]
    assert all(-1e-5 <= x <= 1 + 1e-5 for x in rule)
    assert any(abs(r) > 1e-4 for r in runs["replace"])  # a random RM gives non-zero scores


def test_missing_model_path_is_a_clear_error(workspace, capsys):
    args = _args(workspace, workspace["root"] / "nomodel", "actor_rollout_ref.model.path=/nonexistent/model")
    assert verl_main(args) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/model" in err and "does not exist" in err


# ------------------------------------------------------------------------------------ K22a: KL routing
def _run_recording_engines(argv: list[str]) -> list[str]:
    """Run `verl train`; return the kind of every training engine built: "trainable" or "forward-only" (ref)."""
    from verl.engines.reference.training import ReferenceTrainingEngine

    built: list[str] = []
    real_init = ReferenceTrainingEngine.__init__

    def recording_init(self, model, settings, *, optim=None, **kw):
        built.append("forward-only" if optim is None else "trainable")
        real_init(self, model, settings, optim=optim, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ReferenceTrainingEngine, "__init__", recording_init)
        assert verl_main(argv) == 0
    return built


def _one_step(ws: dict[str, Path], name: str, *overrides: str) -> tuple[dict, list[str]]:
    run_dir = ws["root"] / name
    args = _args(ws, run_dir, "trainer.total_training_steps=1", *overrides)
    args += ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]
    built = _run_recording_engines(args)
    (row,) = _metrics(run_dir)
    return row, built


def test_k22a_no_kl_means_no_reference_pass_and_no_reference_engine(workspace):
    row, built = _one_step(
        workspace, "kl_off", "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false"
    )
    assert built == ["trainable"]  # the actor only: no reference model was loaded
    assert "timing_s/ref" not in row
    # No KL-to-reference metric at all (actor/ppo_kl is old-vs-new policy, not the reference).
    ref_kl = [k for k in row if k.startswith(("actor/kl_", "actor/reward_kl_"))]
    assert ref_kl == []
    # KL in the reward is never switched on implicitly: rewards are the scores
    assert row["critic/rewards/mean"] == pytest.approx(row["critic/score/mean"], abs=1e-12)


def test_k22a_default_run_has_no_reference_pass(full_run):
    # The three-step run above uses the shipped defaults: both KL switches off, so no "ref" stage ran.
    import yaml

    cfg = yaml.safe_load((full_run / "config.yaml").read_text())
    assert cfg["actor_rollout_ref"]["actor"]["use_kl_loss"] is False
    assert cfg["algorithm"]["use_kl_in_reward"] is False
    for row in (r for r in _metrics(full_run) if r["step"] > 0):
        assert "timing_s/ref" not in row
        assert "actor/kl_loss" not in row and "actor/reward_kl_penalty" not in row


def test_k22_kl_loss_runs_the_reference_policy(workspace):
    row, built = _one_step(workspace, "kl_loss", "actor_rollout_ref.actor.use_kl_loss=true")
    assert sorted(built) == ["forward-only", "trainable"]
    assert "timing_s/ref" in row and math.isfinite(row["timing_s/ref"])
    assert math.isfinite(row["actor/kl_loss"])
    assert "actor/reward_kl_penalty" not in row  # the KL loss does not also go into the reward
    assert row["critic/rewards/mean"] == pytest.approx(row["critic/score/mean"], abs=1e-12)


def test_k22_kl_in_reward_logs_the_penalty(workspace):
    row, built = _one_step(workspace, "kl_reward", "algorithm.use_kl_in_reward=true")
    assert sorted(built) == ["forward-only", "trainable"]
    assert "timing_s/ref" in row
    assert math.isfinite(row["actor/reward_kl_penalty"])
    assert math.isfinite(row["actor/reward_kl_penalty_coeff"])
    assert "actor/kl_loss" not in row  # and not into the loss


def test_unavailable_device_is_a_clear_error_before_loading(workspace, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present, so trainer.device=cuda is valid here")
    assert verl_main(_args(workspace, workspace["root"] / "nocuda", "trainer.device=cuda")) == 2
    err = capsys.readouterr().err
    assert "cuda" in err and "not available" in err and "Traceback" not in err


def test_rollout_that_reorders_rows_is_caught_k13(workspace, monkeypatch, capsys):
    from verl.engines.reference.rollout import HFRolloutEngine

    real_generate = HFRolloutEngine.generate

    def reversed_generate(self, prompts):
        out = real_generate(self, prompts)
        return out[list(range(len(out) - 1, -1, -1))]  # a buggy backend that returns rows reversed

    monkeypatch.setattr(HFRolloutEngine, "generate", reversed_generate)
    args = _args(workspace, workspace["root"] / "reordered", "trainer.total_training_steps=1")
    args += ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"]
    with pytest.raises(Exception, match="different order than its prompts") as info:
        verl_main(args)
    assert "row 0" in str(info.value) or "row 0" in str(info.value.__cause__)


VOTING_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Digit share as the score; the first character as the extracted answer (the maj@N vote)."""
    share = sum(c.isdigit() for c in solution_str) / len(solution_str) if solution_str else 0.0
    return {"score": share, "pred": solution_str[:1]}
'''


def test_validation_with_n_samples_reports_verl_metrics_and_logs_generations(workspace, tmp_path):
    reward = tmp_path / "voting.py"
    reward.write_text(VOTING_REWARD)
    run_dir = tmp_path / "val_n"
    args = _args(
        workspace,
        run_dir,
        f"custom_reward_function.path={reward}",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "trainer.log_val_generations=3",
        f"trainer.validation_data_dir={tmp_path / 'val_dump'}",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
    )
    assert verl_main(args) == 0
    val = _metrics(run_dir)[0]
    dumped = [json.loads(x) for x in (tmp_path / "val_dump" / "0.jsonl").read_text().splitlines()]
    assert len(dumped) == 8  # 4 prompts x 2 samples
    # No acc reported: the core variable is the reward; its mean@2 is the mean of the dumped scores.
    assert val["val-core/openai/gsm8k/reward/mean@2"] == pytest.approx(sum(r["score"] for r in dumped) / 8)
    for key in ("best@2/mean", "maj@2/mean"):
        assert f"val-core/openai/gsm8k/reward/{key}" in val, key
    assert "val-aux/openai/gsm8k/reward/worst@2/mean" in val
    best, mean = val["val-core/openai/gsm8k/reward/best@2/mean"], val["val-core/openai/gsm8k/reward/mean@2"]
    assert best >= mean - 1e-9
    logged = [json.loads(x) for x in (run_dir / "val_generations.jsonl").read_text().splitlines()]
    assert len(logged) == 3 and all(r["step"] == 0 for r in logged)
    # The logged samples are dumped ones: same (input, output, score) triples.
    dumped_triples = {(r["input"], r["output"], round(r["score"], 6)) for r in dumped}
    assert all((r["input"], r["output"], round(r["score"], 6)) in dumped_triples for r in logged)


def test_host_allocator_policy_changes_no_result(workspace, tmp_path):
    """The ``caching`` host allocator (the cpu platform's default, ``VERL_CPU_ALLOCATOR``) hands tensors reused heap
    memory where glibc's defaults hand fresh zero pages: a kernel that read memory it never wrote would differ
    between the two. Two ``verl train`` processes, one per policy, log the same metrics at every step."""
    import os
    import subprocess
    import sys

    rows = {}
    for policy in ("system", "caching"):
        run_dir = tmp_path / policy
        env = dict(os.environ, VERL_CPU_ALLOCATOR=policy)
        args = _args(
            workspace, run_dir, "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false"
        )
        done = subprocess.run(
            [sys.executable, "-m", "verl.cli.main", *args], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"host allocator of the actor/rollout workers: {policy}" in done.stderr, done.stderr[-3000:]
        rows[policy] = [_strip_timing(r) for r in _metrics(run_dir)]
    assert [r["step"] for r in rows["system"] if r["step"] > 0] == [1, 2, 3]
    assert rows["caching"] == rows["system"]
