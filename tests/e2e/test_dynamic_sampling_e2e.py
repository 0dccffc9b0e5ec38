"""DAPO dynamic sampling (``algorithm.filter_groups``) end to end with a tiny model: `verl train` as a user runs it.

The reward makes the groups of even-index prompts constant (dropped) and those of odd-index prompts vary
(kept), so which prompts each step generates and trains on follows from the loader's order alone, written
down here from the sampler's documented formula (``numpy.random.default_rng((seed, epoch)).permutation``),
and is compared with the logged counts and the rollout dump of the trained batch.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace, run_metrics

PROMPTS, TRAIN_BSZ, GEN_BSZ, N, STEPS = 8, 2, 3, 2, 3

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Even-index prompts: the same score for every response. Odd: a weighted character sum of the response.
    ``spread`` repeats the score, for runs where a reward model adds to it."""
    if extra_info["index"] % 2 == 0:
        return {"score": 0.5, "acc": 0.0, "spread": 0.5}
    value = sum((i + 1) * ord(c) for i, c in enumerate(solution_str)) / 1e4
    return {"score": value, "acc": 1.0, "spread": value}
'''
CONSTANT = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    ws = make_gsm8k_workspace(tmp_path_factory.mktemp("dapo"), train=PROMPTS, test=2, reward_source=REWARD)
    ws["constant"] = ws["root"] / "constant.py"
    ws["constant"].write_text(CONSTANT)
    return ws


def _args(ws: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        f"data.val_files=[{ws['test']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=12",
        f"data.train_batch_size={TRAIN_BSZ}",
        f"data.gen_batch_size={GEN_BSZ}",
        f"actor_rollout_ref.model.path={ws['model']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={TRAIN_BSZ}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=0.01",
        f"actor_rollout_ref.rollout.n={N}",
        f"custom_reward_function.path={ws['reward']}",
        "algorithm.adv_estimator=grpo",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        *extra,
    ]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def expected_steps(steps: int) -> list[dict]:
    """Each step's rounds by hand: loader batches of GEN_BSZ prompts (drop_last) in the order of
    ``default_rng((1, epoch)).permutation(PROMPTS)`` (data.seed null = 1), odd indices kept, rounds until
    TRAIN_BSZ are kept, then the first TRAIN_BSZ kept prompts trained on."""
    per_epoch = PROMPTS // GEN_BSZ
    batches = (
        np.random.default_rng((1, epoch)).permutation(PROMPTS)[b * GEN_BSZ : (b + 1) * GEN_BSZ].tolist()
        for epoch in range(100)
        for b in range(per_epoch)
    )
    out, taken = [], 0
    for _ in range(steps):
        rounds, kept, dropped = 0, [], 0
        while len(kept) < TRAIN_BSZ:
            prompts = next(batches)
            taken, rounds = taken + 1, rounds + 1
            kept += [p for p in prompts if p % 2]
            dropped += sum(1 for p in prompts if p % 2 == 0)
        out.append(
            {
                "train/num_gen_batches": rounds,
                "train/filter_groups/kept": len(kept),
                "train/filter_groups/dropped": dropped,
                "train/filter_groups/surplus": len(kept) - TRAIN_BSZ,
                "trained": kept[:TRAIN_BSZ],
                "training/epoch": (taken - 1) // per_epoch,
            }
        )
    return out


@pytest.fixture(scope="module")
def full_run(workspace) -> Path:
    run_dir = workspace["root"] / "run_a"
    assert verl_main(_args(workspace, run_dir)) == 0
    return run_dir


def test_each_step_trains_train_batch_size_kept_groups_and_logs_the_counts(workspace, full_run):
    questions = {
        row["extra_info"]["question"]: row["extra_info"]["index"]
        for row in pq.read_table(workspace["train"]).to_pylist()
    }
    assert sorted(questions.values()) == list(range(PROMPTS))
    expected = expected_steps(STEPS)
    # The scenario covers a one-round step, steps whose rounds cross an epoch, and a round that keeps more
    # groups than its step needs.
    assert [e["train/num_gen_batches"] for e in expected] == [1, 3, 2]
    assert [e["training/epoch"] for e in expected] == [0, 1, 2] and expected[2]["train/filter_groups/surplus"] == 1
    rows = _metrics(full_run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row, want in zip(rows, expected, strict=True):
        assert row["data/filtered_prompts"] == 0  # every prompt in the file is in the dataset, in file order
        for key, value in want.items():
            if key != "trained":
                assert row[key] == value, (row["step"], key)
        samples = [json.loads(x) for x in (full_run / "rollouts" / f"{row['step']}.jsonl").read_text().splitlines()]
        assert len(samples) == TRAIN_BSZ * N
        trained = [next(i for q, i in questions.items() if q in s["input"]) for s in samples]
        assert trained == [p for p in want["trained"] for _ in range(N)]  # groups in generation order
        assert len({s["uid"] for s in samples}) == TRAIN_BSZ
        scores = [s["score"] for s in samples]
        assert np.mean(scores) == pytest.approx(row["critic/score/mean"], abs=1e-6)
        for g in range(TRAIN_BSZ):  # every trained group has spread
            assert max(scores[g * N : (g + 1) * N]) > min(scores[g * N : (g + 1) * N])
        assert row["timing_s/gen"] > 0 and math.isfinite(row["actor/pg_loss"])


def test_resume_from_step_2_reproduces_step_3(workspace, full_run):
    """The loader position in data.pt counts every round, so a resumed run generates what the first did."""
    run_dir = workspace["root"] / "run_b"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(full_run / "ckpt" / "global_step_2", ckpt / "global_step_2")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    assert verl_main(_args(workspace, run_dir, "trainer.resume_mode=auto")) == 0
    (resumed,) = _metrics(run_dir)
    expected = _metrics(full_run)[2]
    assert resumed["step"] == 3 and resumed["train/num_gen_batches"] == expected_steps(3)[2]["train/num_gen_batches"]
    assert run_metrics(resumed) == run_metrics(expected)


def test_in_reward_kl_filters_on_seq_final_reward_in_every_round(workspace, full_run):
    """With the in-reward KL each round computes old and reference log-probs before the filter (verl). At step 1
    the policy is the reference, so the KL is 0, seq_final_reward equals the score and the same groups go."""
    run_dir = workspace["root"] / "kl"
    extra = ["algorithm.use_kl_in_reward=true", "algorithm.filter_groups.metric=seq_final_reward"]
    assert verl_main(_args(workspace, run_dir, *extra, "trainer.total_training_steps=1", "trainer.save_freq=-1")) == 0
    (row,) = _metrics(run_dir)
    first = _metrics(full_run)[0]
    assert row["actor/reward_kl_penalty"] == 0.0
    for key in (
        "train/num_gen_batches",
        "train/filter_groups/kept",
        "train/filter_groups/dropped",
        "critic/score/mean",
    ):
        assert row[key] == first[key], key
    assert row["timing_s/old_log_prob"] > 0 and row["timing_s/ref"] > 0


def test_a_reward_model_scores_every_round_in_training_mode(workspace, tmp_path):
    """The reward model runs with the rollout asleep, so each round switches to training and, when another round
    follows, back to generation; the filter reads compute_score's ``spread`` (the RM adds to the score)."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from verl.testing.tiny import make_tiny_tokenizer
    from verl.trainer.switching import ModeSwitcher

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
    run_dir = workspace["root"] / "rm"
    extra = ["reward_model.enable=true", f"reward_model.model.path={tmp_path / 'rm'}", "reward_model.combine=sum"]
    extra += ["algorithm.filter_groups.metric=spread", "trainer.total_training_steps=2", "trainer.save_freq=-1"]
    calls: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        for name in ("to_training", "to_generation"):
            real = getattr(ModeSwitcher, name)
            mp.setattr(ModeSwitcher, name, lambda self, stage, _r=real, _n=name: calls.append(_n) or _r(self, stage))
        assert verl_main(_args(workspace, run_dir, *extra)) == 0
    rows = _metrics(run_dir)
    expected = expected_steps(2)
    for row, want in zip(rows, expected, strict=True):
        for key in ("train/num_gen_batches", "train/filter_groups/kept", "train/filter_groups/dropped"):
            assert row[key] == want[key], (row["step"], key)
        assert row["timing_s/rm"] > 0
    # Step 1: one round; step 2: three rounds, switching back to generation between them.
    assert calls == ["to_training", "to_generation"] + ["to_training", "to_generation"] * 3


def test_the_round_limit_stops_the_run_with_verls_advice(workspace, capsys):
    run_dir = workspace["root"] / "limit"
    extra = [f"custom_reward_function.path={workspace['constant']}", "algorithm.filter_groups.metric=acc"]
    assert verl_main(_args(workspace, run_dir, *extra, "algorithm.filter_groups.max_num_gen_batches=2")) == 1
    err = capsys.readouterr().err
    assert "num_gen_batches=2 >= algorithm.filter_groups.max_num_gen_batches=2" in err
    assert "only 0 of data.train_batch_size=2 groups" in err and "verl train: stopped at step 0" in err
    assert not (run_dir / "ckpt" / "global_step_1").exists()
