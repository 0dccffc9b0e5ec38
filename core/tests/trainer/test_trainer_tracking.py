"""Tracking backends: console lines, metrics.jsonl content, tensorboard events, validation samples."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.trainer.tracking import (
    METRICS_FILE,
    Tracking,
    TrackingBackendError,
    ValidationGenerationsLogger,
    to_json_safe,
)


def read_jsonl_strict(path: Path) -> list[dict]:
    def reject(name: str):
        raise AssertionError(f"non-standard JSON constant {name} in {path}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_unknown_backend_lists_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(TrackingBackendError, match=r"'consle'.*valid: \['console', 'file', 'tensorboard', 'wandb'"):
        Tracking("p", "e", ["file", "consle"], tmp_path)
    assert not (tmp_path / METRICS_FILE).exists()  # names checked before any backend opened a file
    with pytest.raises(ValueError, match="'trackio' is a verl logger not shipped here"):
        Tracking("p", "e", "trackio", tmp_path)


def test_file_backend_writes_one_strict_json_object_per_step(tmp_path: Path) -> None:
    tracking = Tracking("proj", "exp", ["file"], tmp_path / "run")
    tracking.log(
        {
            "critic/score/mean": 0.25,
            "actor/pg_loss": np.float32(-0.5),
            "actor/grad_norm": torch.tensor(2.0),
            "actor/ppo_kl": float("nan"),
            "perf/throughput": float("inf"),
            "perf/total_num_tokens": np.int64(12),
            "note": "text",
        },
        step=1,
    )
    path = tmp_path / "run" / METRICS_FILE
    assert read_jsonl_strict(path) == [  # visible before close: flushed each step
        {
            "step": 1,
            "critic/score/mean": 0.25,
            "actor/pg_loss": -0.5,
            "actor/grad_norm": 2.0,
            "actor/ppo_kl": None,
            "perf/throughput": None,
            "perf/total_num_tokens": 12,
            "note": "text",
        }
    ]
    tracking.log({"critic/score/mean": 0.5, "step": 99}, step=2)
    tracking.close()
    tracking.close()  # idempotent
    # a resumed run appends to the same file
    with Tracking("proj", "exp", "file", tmp_path / "run") as again:
        again.log({"critic/score/mean": 0.75}, step=3)
    records = read_jsonl_strict(path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[1] == {"step": 2, "critic/score/mean": 0.5}
    assert records[2] == {"step": 3, "critic/score/mean": 0.75}


def test_to_json_safe_nested() -> None:
    value = {1: [np.float64("nan"), np.arange(3)], "t": torch.tensor([[1.5]]), "o": Path("/x")}
    assert to_json_safe(value) == {"1": [None, [0, 1, 2]], "t": [[1.5]], "o": "/x"}


def test_console_line_non_tty(tmp_path: Path) -> None:
    out = io.StringIO()
    tracking = Tracking("p", "exp", "console", tmp_path, total_steps=10, stream=out)
    tracking.log(
        {
            "critic/score/mean": 0.25,
            "actor/pg_loss": -0.012341,
            "response_length/mean": 45.25,
            "timing_s/step": 12.3456,
            "actor/lr": 1e-6,
            "val-core/openai/gsm8k/acc/mean@1": 0.5,
        },
        step=3,
    )
    tracking.log({"actor/pg_loss": 1.0}, step=4)
    tracking.close()
    assert out.getvalue().splitlines() == [
        "step 3/10 | score 0.25 | pg_loss -0.01234 | resp_len 45.25 | step_s 12.35 | val-core/openai/gsm8k/acc/mean@1 0.5",
        "step 4/10 | pg_loss 1",
    ]
    assert not (tmp_path / METRICS_FILE).exists()


def test_console_progress_bar_on_tty(tmp_path: Path) -> None:
    out = TTY()
    tracking = Tracking("p", "exp", "console", tmp_path, total_steps=4, stream=out)
    tracking.log({"critic/score/mean": 1.0}, step=1)
    tracking.log({"critic/score/mean": 1.0}, step=2)
    tracking.close()
    text = out.getvalue()
    assert "step 2/4 | score 1" in text
    assert "2/4 [" in text and "exp" in text  # tqdm's bar: "exp:  50%|...| 2/4 [..."


def read_tb_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_event_file_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    tracking = Tracking("p", "e", ["tensorboard", "file"], tmp_path, config_dict={"trainer": {"total_epochs": 1}})
    tracking.log({"critic/score/mean": 0.25, "note": "skipped", "actor/grad_norm": torch.tensor(3.0)}, step=1)
    tracking.log({"critic/score/mean": 0.75}, step=2)
    tracking.log_generations([("q", "a", 1.0)], step=2)
    tracking.close()
    log_dir = tmp_path / "tensorboard"
    assert list(log_dir.glob("events.out.tfevents.*"))
    assert read_tb_scalars(log_dir, "critic/score/mean") == [(1, 0.25), (2, 0.75)]
    assert read_tb_scalars(log_dir, "actor/grad_norm") == [(1, 3.0)]


def test_tensorboard_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb_elsewhere"))
    with Tracking("p", "e", ["tensorboard"], tmp_path / "run") as tracking:
        tracking.log({"x": 1.0}, step=1)
    assert list((tmp_path / "tb_elsewhere").glob("events.out.tfevents.*"))


def test_tensorboard_missing_gives_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now raises ImportError
    with pytest.raises(TrackingBackendError, match="pip install tensorboard"):
        Tracking("p", "e", ["file", "tensorboard"], tmp_path)


def test_validation_generations_selection_and_file(tmp_path: Path) -> None:
    inputs = ["q4", "q1", "q3", "q0", "q2"]
    outputs = [f"a{q[1]}" for q in inputs]
    scores = [float(q[1]) for q in inputs]
    out = io.StringIO()
    tracking = Tracking("p", "e", ["file", "console"], tmp_path, stream=out)
    logged = ValidationGenerationsLogger(tracking, num_samples=3).log(inputs, outputs, scores, step=7)
    tracking.close()

    # verl: sort by input, shuffle with RandomState(42), keep the first N
    order = np.random.RandomState(42).permutation(5)[:3]
    expected = [(f"q{i}", f"a{i}", float(i)) for i in order]
    assert logged == expected
    records = read_jsonl_strict(tmp_path / "val_generations.jsonl")
    assert records == [{"step": 7, "input": i, "output": o, "score": s} for i, o, s in expected]
    assert f"[val step 7 sample 0] score {expected[0][2]:.4g}" in out.getvalue()
    # same prompts whatever order they arrive in
    shuffled = ValidationGenerationsLogger(tracking, 3).select(inputs[::-1], outputs[::-1], scores[::-1])
    assert shuffled == expected


def test_validation_generations_zero_logs_nothing(tmp_path: Path) -> None:
    tracking = Tracking("p", "e", ["file"], tmp_path)
    assert ValidationGenerationsLogger(tracking, 0).log(["q"], ["a"], [1.0], step=1) == []
    tracking.close()
    assert not (tmp_path / "val_generations.jsonl").exists()
    with pytest.raises(ValueError, match="lengths differ"):
        ValidationGenerationsLogger(tracking, 1).select(["q"], [], [1.0])
