"""swanlab backend in offline mode (SWANLAB_MODE=offline): the run file and config swanlab writes locally."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl.trainer.tracking import Tracking

swanlab = pytest.importorskip("swanlab")


def read_records(log_dir: Path) -> list:
    """Every record of the one run under ``log_dir``, parsed with swanlab's own reader and protobuf types."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (run_file,) = log_dir.glob("run-*/run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    try:
        records = []
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            records.append(record)
        return records
    finally:
        reader.close()


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log_dir = tmp_path / "swanlog"
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(log_dir))
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    return log_dir


def test_scalars_and_config_reach_the_offline_run(offline: Path, tmp_path: Path) -> None:
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    config = {"trainer": {"total_epochs": 3}, "algorithm": {"adv_estimator": "grpo"}}
    with Tracking("proj", "exp", ["swanlab"], tmp_path / "run", config_dict=config) as tracking:
        tracking.log({"critic/score/mean": 0.25, "actor/pg_loss": -0.5, "note": "text"}, step=1)
        tracking.log({"critic/score/mean": 0.75}, step=2)
        tracking.log_generations([("q1", "a1", 1.0)], step=2)
    records = read_records(offline)
    (start,) = [r.start for r in records if r.WhichOneof("record_type") == "start"]
    assert (start.project, start.name) == ("proj", "exp")
    scalars = sorted(
        (r.scalar.key, r.scalar.step, r.scalar.value.number) for r in records if r.WhichOneof("record_type") == "scalar"
    )
    assert scalars == [("actor/pg_loss", 1, -0.5), ("critic/score/mean", 1, 0.25), ("critic/score/mean", 2, 0.75)]
    columns = {r.column.column_key for r in records if r.WhichOneof("record_type") == "column"}
    assert "val/generations" in columns and "note" not in columns
    (finish,) = [r.finish for r in records if r.WhichOneof("record_type") == "finish"]
    assert finish.state == RunState.Value("RUN_STATE_FINISHED")
    (config_file,) = offline.glob("run-*/files/config.yaml")
    saved = {k: v["value"] for k, v in yaml.safe_load(config_file.read_text()).items()}
    assert saved == {"FRAMEWORK": "verl", **config}


def test_failed_run_is_marked_crashed(offline: Path, tmp_path: Path) -> None:
    from swanlab.proto.swanlab.run.v1.run_pb2 import RunState

    tracking = Tracking("proj", "exp", ["swanlab"], tmp_path)
    tracking.log({"x": 1.0}, step=1)
    tracking.finish(exit_code=1)
    (finish,) = [r.finish for r in read_records(offline) if r.WhichOneof("record_type") == "finish"]
    assert finish.state == RunState.Value("RUN_STATE_CRASHED")


def test_log_dir_defaults_to_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("SWANLAB_LOG_DIR", raising=False)
    with Tracking("proj", "exp", ["swanlab"], tmp_path / "run") as tracking:
        tracking.log({"x": 1.0}, step=1)
    assert [
        (r.scalar.key, r.scalar.value.number)
        for r in read_records(tmp_path / "run" / "swanlog")
        if r.HasField("scalar")
    ] == [("x", 1.0)]
