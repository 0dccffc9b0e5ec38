"""A `verl train` that stops on an error marks its logger run failed (verl's ``Tracking.finish(exit_code)``).

A real one-step run of a tiny model whose reward function raises with ``reward_model.on_error=fail``; the
mlflow run (a local sqlite store) must end ``FAILED``, not ``FINISHED``, so a dashboard shows the crash.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("sqlalchemy")

RAISING_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    raise RuntimeError("scorer bug")
"""


def test_failed_run_marks_the_logger_run_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_gsm8k_workspace(tmp_path / "ws", train=2, test=2, reward_source=RAISING_REWARD)
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    status = verl_main(
        [
            "train",
            "--run-dir",
            str(tmp_path / "run"),
            f"data.train_files=[{ws['train']}]",
            f"data.val_files=[{ws['test']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=4",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={ws['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            "actor_rollout_ref.actor.use_torch_compile=false",
            "actor_rollout_ref.rollout.n=1",
            f"custom_reward_function.path={ws['reward']}",
            "reward_model.on_error=fail",
            "reward_model.reward_kwargs={}",
            "trainer.total_training_steps=1",
            "trainer.save_freq=0",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.logger=[file,mlflow]",
        ]
    )
    assert status == 1
    runs = mlflow.MlflowClient(tracking_uri=store).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(tracking_uri=store).search_experiments()]
    )
    assert [run.info.status for run in runs] == ["FAILED"]
