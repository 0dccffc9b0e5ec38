"""`verl train --run-dir`: two runs never see each other's checkpoints, and a fresh run keeps an earlier run's
metrics. Real one-step runs of a tiny model (about half a minute each on 2 cores)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import DIGIT_SHARE_REWARD, make_gsm8k_workspace

# The built-in run config's reward_model.reward_kwargs (method, format_score) reach a custom scorer too.
REWARD = DIGIT_SHARE_REWARD.replace("extra_info=None)", "extra_info=None, **reward_kwargs)")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("run_dir_e2e"), train=4, test=2, reward_source=REWARD)


def _args(ws: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    # No trainer.default_local_dir and no sample folders: both must follow --run-dir. The options sit
    # between the overrides on purpose.
    return [
        "train",
        f"data.train_files=[{ws['train']}]",
        "--run-dir",
        str(run_dir),
        f"data.val_files=[{ws['test']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        "data.val_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        *extra,
    ]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def cwd(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cwd")


@pytest.fixture(scope="module")
def run_a(workspace, cwd) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        run = workspace["root"] / "run_a"
        assert verl_main(_args(workspace, run)) == 0
    return run


def test_checkpoints_and_samples_live_in_the_run_dir(run_a, cwd):
    assert (run_a / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert (run_a / "checkpoints" / "global_step_1" / "actor").is_dir()
    assert (run_a / "rollouts" / "1.jsonl").is_file()  # the built-in run config's rollouts/, moved along
    assert _steps(run_a / "metrics.jsonl") == [1]
    assert not (cwd / "checkpoints").exists() and not (cwd / "runs").exists()  # nothing in the default places
    assert (run_a / "config.yaml").read_text().startswith("# base config: gsm8k_grpo_smollm2_cpu ")


def test_second_run_dir_trains_on_its_own_and_keeps_earlier_metrics(workspace, run_a, cwd, capsys):
    # run_b holds an earlier run's real metrics.jsonl (run_a's) but no checkpoint of its own. Before the fix
    # both runs shared checkpoints/<project>/<experiment>: run_b reported run_a's step 1 as "already finished",
    # and a fresh run rewound the earlier metrics.jsonl to zero rows.
    run_b = workspace["root"] / "run_b"
    run_b.mkdir()
    earlier = (run_a / "metrics.jsonl").read_text()
    shutil.copy(run_a / "metrics.jsonl", run_b / "metrics.jsonl")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert verl_main(_args(workspace, run_b)) == 0
    out = capsys.readouterr().out
    assert "already finished" not in out and "its outputs were kept, renamed" in out
    kept = [p for p in run_b.glob("metrics.*.jsonl")]
    assert len(kept) == 1 and kept[0].read_text() == earlier
    assert _steps(run_b / "metrics.jsonl") == [1]  # this run's own row
    assert (run_b / "checkpoints" / "global_step_1").is_dir() and (run_b / "final_hf").is_dir()
    assert (run_a / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert (run_a / "metrics.jsonl").read_text() == earlier


def test_rerun_in_the_first_run_dir_resumes_from_its_own_checkpoint(workspace, run_a, cwd, capsys):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert verl_main(_args(workspace, run_a)) == 0
    out = capsys.readouterr().out
    assert f"already finished (1/1 steps in {run_a / 'checkpoints' / 'global_step_1'})" in out
    assert "renamed" not in out and not list(run_a.glob("metrics.*.jsonl"))
