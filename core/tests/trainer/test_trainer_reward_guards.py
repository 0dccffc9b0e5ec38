"""`verl train` never trains or validates on rewards that were never computed.

* every reward of a step failed: the run stops (exit 1) naming the reward function, the first exception and its
  sample, unless ``reward_model.stop_on_all_failed=false``; validation too;
* a dataset without the columns the reward manager reads fails at load (exit 2), naming the file and column,
  before any model generates anything.

Real one- or two-step runs of a tiny model on 4 GSM8K rows (a few seconds each on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace

# Fails on the rows named by FAIL_ON (the split in extra_info), scores the others.
REWARD = """
FAIL_ON = {fail_on!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if extra_info["split"] in FAIL_ON:
        raise KeyError(f"no field 'answer_v2' in row {{extra_info['index']}}")
    return len(solution_str) / 100
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    ws = make_gsm8k_workspace(tmp_path_factory.mktemp("reward_guards"), train=4, test=2)
    for name, fail_on in (("fail_train", ("train",)), ("fail_test", ("test",))):
        ws[name] = ws["root"] / f"{name}.py"
        ws[name].write_text(REWARD.format(fail_on=fail_on))
    return ws


def _args(ws: dict[str, Path], run_dir: Path, reward: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={reward}",
        "reward_model.num_workers=1",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *extra,
    ]


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_step_whose_every_reward_failed_stops_the_run(workspace, capsys):
    run_dir = workspace["root"] / "all_failed"
    assert verl_main(_args(workspace, run_dir, workspace["fail_train"])) == 1
    err = capsys.readouterr().err
    for part in (
        "every reward failed: all 4 samples of training step 1 failed",
        f"'compute_score' in {workspace['fail_train']}",  # the reward function
        "sample 0 (data_source='openai/gsm8k'): exception: KeyError:",  # the first exception and its sample
        "no field 'answer_v2' in row",
        "reward_model.stop_on_all_failed=false",
        "stopped at step 0",
    ):
        assert part in err, (part, err)
    assert "Traceback" not in err and _steps(run_dir) == [] and not (run_dir / "final_hf").exists()


def test_stop_on_all_failed_false_trains_on_zeros_and_counts(workspace, capsys):
    run_dir = workspace["root"] / "tolerated"
    args = _args(workspace, run_dir, workspace["fail_train"], "reward_model.stop_on_all_failed=false")
    assert verl_main(args) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["reward/errors"] for r in rows] == [4, 4] and [r["critic/score/mean"] for r in rows] == [0.0, 0.0]


def test_a_validation_whose_every_reward_failed_stops_the_run(workspace, capsys):
    run_dir = workspace["root"] / "val_failed"
    args = _args(
        workspace,
        run_dir,
        workspace["fail_test"],
        f"data.val_files=[{workspace['test']}]",
        "trainer.val_before_train=true",
    )
    assert verl_main(args) == 1
    err = capsys.readouterr().err
    assert "every reward failed: all 2 samples of validation at step 0 failed" in err, err
    assert "stopped at step 0" in err and _steps(run_dir) == []


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_dataset_without_the_reward_model_column_fails_at_load(workspace, split, capsys):
    table = pq.read_table(workspace[split]).drop_columns(["reward_model"])
    bare = workspace["root"] / f"{split}_no_reward_model.parquet"
    pq.write_table(table, bare)
    run_dir = workspace["root"] / f"no_reward_model_{split}"
    files = [f"data.train_files=[{bare}]"] if split == "train" else [f"data.val_files=[{bare}]"]
    assert verl_main(_args(workspace, run_dir, workspace["reward"], *files)) == 2
    err = capsys.readouterr().err
    assert f"error: {bare}: no 'reward_model' column" in err, err
    assert "'ground_truth'" in err and "Traceback" not in err, err
    assert _steps(run_dir) == [] and not list(run_dir.glob("ckpt/global_step_*"))  # nothing generated or trained
