"""mlflow backend against a local sqlite store (verl's default kind of MLFLOW_TRACKING_URI), read back with
MLflow's client API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.trainer.trackers import TrackingBackendError
from verl.trainer.tracking import Tracking

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("sqlalchemy")  # the sqlite store (part of the mlflow extra)


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One database for the module: creating one runs MLflow's schema migrations (seconds each).
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlruns.db'}"


@pytest.fixture
def store(store_uri: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    uri = store_uri
    # A sqlite store puts artifacts in ./mlruns (MLflow's default artifact root): keep them out of the checkout.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    yield uri
    while mlflow.active_run() is not None:  # never leak an active run into other tests
        mlflow.end_run()


def test_metrics_params_and_samples_reach_the_store(store: str, tmp_path: Path) -> None:
    config = {"trainer": {"total_epochs": 3, "logger": ["mlflow"]}, "algorithm": {"gamma": 1.0}}
    with Tracking("proj", "exp", ["mlflow"], tmp_path / "run", config_dict=config) as tracking:
        run_id = tracking.backends["mlflow"].run_id
        tracking.log({"critic/score/mean": 0.25, "val-core/gsm8k/acc/best@2/mean": 0.5, "note": "text"}, step=1)
        tracking.log({"critic/score/mean": 0.75}, step=2)
        tracking.log_generations([("q1", "a1", 1.0), ("q2", "a2", 0.0)], step=2)
    client = mlflow.MlflowClient(tracking_uri=store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "exp"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.75)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val-core/gsm8k/acc/best_at_2/mean")] == [
        (1, 0.5)
    ]
    assert "note" not in run.data.metrics
    assert run.data.params == {
        "trainer/total_epochs": "3",
        "trainer/logger/list_len": "1",
        "trainer/logger/0": "mlflow",
        "algorithm/gamma": "1.0",
    }
    local = client.download_artifacts(run_id, "val_step2.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text()) == [
        {"input": "q1", "output": "a1", "score": 1.0},
        {"input": "q2", "output": "a2", "score": 0.0},
    ]


def test_run_id_env_attaches_to_an_existing_run(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment_id = client.create_experiment("elsewhere")
    existing = client.create_run(experiment_id).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", existing)
    with Tracking("proj", "exp", ["mlflow"], tmp_path) as tracking:
        tracking.log({"x": 2.0}, step=5)
    assert [(m.step, m.value) for m in client.get_metric_history(existing, "x")] == [(5, 2.0)]


def test_failed_run_is_marked_failed(store: str, tmp_path: Path) -> None:
    tracking = Tracking("proj", "exp", ["mlflow"], tmp_path)
    run_id = tracking.backends["mlflow"].run_id
    tracking.finish(exit_code=1)
    assert mlflow.MlflowClient(tracking_uri=store).get_run(run_id).info.status == "FAILED"


def test_unusable_store_fails_after_retries_naming_the_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from verl.trainer.trackers.mlflow_backend import MAX_ATTEMPTS, MlflowBackend

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://store")
    with pytest.raises(TrackingBackendError, match=r"MLFLOW_TRACKING_URI=nosuchscheme://store after 3 attempts"):
        MlflowBackend("proj", "exp", tmp_path, None, retry_sleep_s=0.0)
    assert sum("mlflow start attempt" in r.getMessage() for r in caplog.records) == MAX_ATTEMPTS - 1
