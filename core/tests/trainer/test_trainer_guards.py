"""Non-finite step guard: consecutive skipped optimizer steps stop the run with a checkpoint and a clear message.

Unit tests feed hand-written ``update_actor`` metrics; the end-to-end test runs ``verl train`` on a tiny model with
a registered policy loss that is always NaN, so every optimizer step is skipped.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest
import torch

from verl.trainer.guards import NonFiniteStepGuard, NonFiniteStepsError

NAN = float("nan")


def metrics(cumulative, norms, ranks=1):
    return {"actor/skipped_steps": [float(cumulative)] * ranks, "actor/grad_norm": list(norms) * ranks}


def test_streak_grows_over_fully_skipped_steps_and_trips_past_the_limit():
    guard = NonFiniteStepGuard(2)
    streaks = []
    for step in (1, 2, 3):
        streaks.append(guard.observe(metrics(step, [NAN]), step)["actor/nonfinite_streak"])
    assert streaks == [1.0, 2.0, 3.0]
    assert guard.tripped and guard.streak_steps == [1, 2, 3]


def test_trips_only_when_exceeding_the_limit():
    guard = NonFiniteStepGuard(2)
    guard.observe(metrics(1, [NAN]), 1)
    guard.observe(metrics(2, [NAN]), 2)
    assert guard.streak == 2 and not guard.tripped


def test_a_finite_step_resets_the_streak():
    guard = NonFiniteStepGuard(5)
    guard.observe(metrics(1, [NAN]), 1)
    guard.observe(metrics(2, [NAN]), 2)
    assert guard.observe(metrics(2, [0.7]), 3)["actor/nonfinite_streak"] == 0.0
    assert guard.streak_steps == []


def test_only_trailing_skips_of_a_partly_applied_step_count():
    guard = NonFiniteStepGuard(5)
    # 4 optimizer steps: skipped, applied, skipped, skipped -> 3 skipped in all, 2 consecutive at the end.
    assert guard.observe(metrics(3, [NAN, 1.0, float("inf"), NAN]), 1)["actor/nonfinite_streak"] == 2.0
    # Next step: both optimizer steps skipped -> the streak continues: 2 + 2.
    assert guard.observe(metrics(5, [NAN, NAN]), 2)["actor/nonfinite_streak"] == 4.0
    assert guard.streak_steps == [1, 2]


def test_ranks_report_the_same_sequence():
    guard = NonFiniteStepGuard(5)
    # Two data-parallel ranks, two optimizer steps each, metrics concatenated rank after rank.
    assert guard.observe(metrics(2, [NAN, NAN], ranks=2), 1)["actor/nonfinite_streak"] == 2.0


def test_resumed_engine_counts_from_its_restored_total():
    guard = NonFiniteStepGuard(5)
    # The engine restored skipped_steps=6 from a checkpoint and skipped one more in this step.
    assert guard.observe(metrics(7, [NAN]), 11)["actor/nonfinite_streak"] == 1.0
    assert guard.observe(metrics(7, [0.3]), 12)["actor/nonfinite_streak"] == 0.0


def test_without_grad_norms_the_skip_count_alone_is_used():
    guard = NonFiniteStepGuard(5)
    guard.observe({"actor/skipped_steps": [0.0]}, 1)
    assert guard.observe({"actor/skipped_steps": [2.0]}, 2)["actor/nonfinite_streak"] == 2.0
    assert guard.observe({"actor/pg_loss": [0.1]}, 3)["actor/nonfinite_streak"] == 2.0  # engine without counter


def test_no_limit_never_trips():
    guard = NonFiniteStepGuard(None)
    for step in range(1, 50):
        guard.observe(metrics(step, [NAN]), step)
    assert guard.streak == 49 and not guard.tripped


@pytest.mark.parametrize("bad", [0, -3])
def test_invalid_limit(bad):
    with pytest.raises(ValueError, match=f"trainer.max_nonfinite_steps={bad}"):
        NonFiniteStepGuard(bad)


def test_stop_saves_then_returns_a_clear_error():
    guard = NonFiniteStepGuard(1)
    guard.observe(metrics(1, [NAN]), 4)
    guard.observe(metrics(2, [NAN]), 5)
    calls = []
    err = guard.stop(lambda: calls.append("saved") or "/ckpt/global_step_5")
    assert calls == ["saved"]
    assert (err.streak, err.limit, err.steps, err.checkpoint) == (2, 1, [4, 5], "/ckpt/global_step_5")
    text = str(err)
    for part in ("2 consecutive", "trainer.max_nonfinite_steps=1", "4-5", "optim.lr", "/ckpt/global_step_5"):
        assert part in text, part
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text


def test_stop_still_reports_when_the_save_fails():
    guard = NonFiniteStepGuard(1)
    guard.observe(metrics(2, [NAN, NAN]), 1)

    def broken():
        raise OSError("disk full")

    err = guard.stop(broken)
    assert isinstance(err, NonFiniteStepsError) and err.checkpoint is None


def test_nothing_applied_only_when_every_update_of_this_process_was_skipped():
    guard = NonFiniteStepGuard(5)
    assert not guard.nothing_applied  # no update yet
    guard.observe(metrics(1, [NAN]), 1)
    guard.observe(metrics(3, [NAN, NAN]), 2)
    assert guard.nothing_applied and not guard.tripped
    guard.observe(metrics(4, [0.5, NAN]), 3)  # one update applied, one skipped: the process changed the weights
    assert guard.streak == 1 and not guard.nothing_applied
    assert not NonFiniteStepGuard(None).nothing_applied  # no limit: never stops


def test_stop_at_the_end_says_nothing_was_applied():
    guard = NonFiniteStepGuard(5)
    guard.observe(metrics(1, [NAN]), 9)
    guard.observe(metrics(2, [NAN]), 10)
    err = guard.stop(None)
    assert err.at_end and (err.streak, err.steps) == (2, [9, 10])
    text = str(err)
    assert "reached its last step" in text and "is not reported as done" in text and "9-10" in text, text
    assert "trainer.max_nonfinite_steps=5" in text and "resume_mode=resume_path" in text, text
    assert pickle.loads(pickle.dumps(err)).at_end


def test_resume_continues_the_streak_the_metrics_show():
    rows = [
        {"step": 0, "val-core/x": 0.1},
        {"step": 1, "actor/nonfinite_streak": 0.0},
        {"step": 2, "actor/nonfinite_streak": 1.0},
        {"step": 3, "actor/nonfinite_streak": 2.0},
        {"step": 4, "actor/nonfinite_streak": 3.0},
    ]
    guard = NonFiniteStepGuard(4)
    guard.resume(rows, 4)
    assert (guard.streak, guard.streak_steps) == (3, [2, 3, 4])
    # The engine restored skipped_steps=3 with the checkpoint and skips again: 3 + 1, then 3 + 2 > 4.
    assert guard.observe(metrics(4, [NAN]), 5)["actor/nonfinite_streak"] == 4.0
    guard.observe(metrics(5, [NAN]), 6)
    assert guard.tripped and guard.streak_steps == [2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "rows",
    [[], [{"step": 4}], [{"step": 4, "actor/nonfinite_streak": 0.0}], [{"step": 3, "actor/nonfinite_streak": 2.0}]],
)
def test_resume_without_a_streak_at_that_step_starts_from_zero(rows):
    guard = NonFiniteStepGuard(4)
    guard.resume(rows, 4)
    assert (guard.streak, guard.streak_steps) == (0, [])


# ----------------------------------------------------------------------------------------------- end to end

LOSS_NAME = "test_guards_always_nan"


def _register_nan_loss() -> None:
    from verl.algorithms import get_policy_loss_fn, register_policy_loss
    from verl.algorithms.registry import POLICY_LOSS_REGISTRY

    if LOSS_NAME in POLICY_LOSS_REGISTRY:
        return
    vanilla = get_policy_loss_fn("vanilla")

    @register_policy_loss(LOSS_NAME)
    def always_nan(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
        **kwargs,
    ):
        loss, out = vanilla(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, **kwargs
        )
        return loss * NAN, out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    from verl.data.gsm8k import default_source_dir, prepare_gsm8k
    from verl.testing.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("guards")
    src = root / "src"
    src.mkdir()
    for split in ("train", "test"):
        with gzip.open(default_source_dir() / f"{split}.jsonl.gz", "rt") as fh:
            rows = [line for line in fh if len(json.loads(line)["question"]) < 220][:8]
        (src / f"{split}.jsonl").write_text("".join(rows))
    files = prepare_gsm8k(root / "data", source_dir=src)
    reward = root / "reward.py"
    # **kwargs: the example config's reward_model.reward_kwargs (method, format_score) reach a custom scorer too.
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))\n"
    )
    return {"root": root, "model": save_tiny_model(root / "tiny"), "reward": reward, **files}


def test_verl_train_stops_after_consecutive_nan_steps(workspace, capsys):
    from verl.cli.main import main as verl_main

    _register_nan_loss()
    run_dir = workspace["root"] / "run"
    ckpt = run_dir / "ckpt"
    code = verl_main(
        [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{workspace['train']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={workspace['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            f"actor_rollout_ref.actor.policy_loss.loss_mode={LOSS_NAME}",
            "actor_rollout_ref.rollout.n=2",
            f"custom_reward_function.path={workspace['reward']}",
            "reward_model.num_workers=1",
            "trainer.total_training_steps=6",
            "trainer.max_nonfinite_steps=2",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={ckpt}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    # One optimizer step per training step (4 rows, mini-batch of 2 prompts x n=2): steps 1, 2, 3 are skipped and
    # the third exceeds the limit of 2.
    assert "3 consecutive optimizer steps" in err and "trainer.max_nonfinite_steps=2" in err, err
    assert "training steps 1-3" in err and "optim.lr" in err and "stopped at step 3" in err, err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["actor/skipped_steps"] for r in rows] == [1.0, 2.0, 3.0]
    assert [r["actor/nonfinite_streak"] for r in rows] == [1.0, 2.0, 3.0]
    # The checkpoint exists (save_freq=-1 saved nothing else) and holds the untouched initial weights.
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("global_step_")) == ["global_step_3"]
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(workspace["model"]).state_dict()
    from verl.engines.reference.checkpoint_files import load_engine_state
    from verl.trainer.checkpoint import verify_checkpoint

    state = load_engine_state(ckpt / "global_step_3" / "actor", 1, 0)
    saved = state["model"]
    assert set(initial) - set(saved) <= {"lm_head.weight"}  # tied embeddings may be stored once
    for name, tensor in saved.items():
        assert torch.equal(tensor, initial[name]), name
    assert state["skipped_steps"] == 3
    # Its manifest records why it is not a healthy checkpoint: finite weights, but every update was skipped.
    health = verify_checkpoint(ckpt / "global_step_3")["health"]
    assert health == {"weights_finite": True, "updates_applied": 0, "updates_skipped": 3, "nonfinite": []}


def test_verl_train_whose_every_update_was_skipped_does_not_end_as_done(workspace, capsys):
    """The default limit (5) is not reached in 3 steps, but no update of the run was applied: exit 1 with the
    reason, no final_hf (before: exit 0, "done", the untouched weights exported as the result)."""
    from verl.cli.main import main as verl_main

    _register_nan_loss()
    run_dir = workspace["root"] / "run_all_skipped"
    code = verl_main(
        [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{workspace['train']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={workspace['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            f"actor_rollout_ref.actor.policy_loss.loss_mode={LOSS_NAME}",
            "actor_rollout_ref.rollout.n=2",
            f"custom_reward_function.path={workspace['reward']}",
            "reward_model.num_workers=1",
            "trainer.total_training_steps=3",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
        ]
    )
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "every optimizer step of this process was skipped" in captured.err, captured.err
    assert "training steps 1-3" in captured.err and "stopped at step 3" in captured.err, captured.err
    assert "done" not in captured.out and not (run_dir / "final_hf").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/nonfinite_streak"] for r in rows] == [1.0, 2.0, 3.0]
    assert (run_dir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"


def test_verl_train_reward_fail_policy_exits_1_naming_the_sample(workspace, capsys):
    from verl.cli.main import main as verl_main

    reward = workspace["root"] / "broken_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    raise ZeroDivisionError('scorer bug')\n"
    )
    run_dir = workspace["root"] / "run_fail"
    code = verl_main(
        [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{workspace['train']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={workspace['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            f"custom_reward_function.path={reward}",
            "reward_model.on_error=fail",
            "reward_model.num_workers=1",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "reward function failed on sample 0 (data_source='openai/gsm8k')" in err, err
    assert "ZeroDivisionError: scorer bug" in err and "stopped at step 0" in err, err
