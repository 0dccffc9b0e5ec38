"""metrics.png: the plotted series equal metrics.jsonl's values; the PNG is valid; refresh cadence; no matplotlib."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest

from verl.trainer.trackers import curves
from verl.trainer.trackers.curves import (
    PNG_FILE,
    MetricsPlot,
    Series,
    curve_series,
    read_metrics,
    series,
    sft_series,
    smoothed,
)
from verl.trainer.tracking import METRICS_FILE, Tracking

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

ROWS = [
    {"step": 0, "val-core/openai/gsm8k/acc/mean@1": 0.125},
    {"step": 1, "critic/score/mean": 0.25, "response_length/mean": 100.0, "actor/kl_loss": 0.001},
    {"step": 2, "critic/score/mean": 0.5, "response_length/mean": 90.0, "actor/kl_loss": None},
    {"step": 3, "critic/score/mean": 0.75, "response_length/mean": 80.0, "actor/kl_loss": 0.003},
    {"step": 4, "critic/score/mean": 1.0, "response_length/mean": 70.0, "val-core/openai/gsm8k/acc/mean@1": 0.5},
]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_series_are_the_files_values(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    write_jsonl(path, ROWS)
    with path.open("a") as fp:
        fp.write('{"step": 5, "critic/score/me')  # a row torn by a kill mid-write
    rows = read_metrics(path)
    assert rows == ROWS
    panels = curve_series(rows)
    assert panels["score"] == [
        Series("critic/score/mean", [1, 2, 3, 4], [0.25, 0.5, 0.75, 1.0]),
        Series("val-core/openai/gsm8k/acc/mean@1", [0, 4], [0.125, 0.5]),
    ]
    assert panels["response length"] == [Series("response_length/mean", [1, 2, 3, 4], [100.0, 90.0, 80.0, 70.0])]
    assert panels["KL"] == [Series("actor/kl_loss", [1, 3], [0.001, 0.003])]  # null (NaN when logged) left out


def test_repeated_step_keeps_the_last_value_and_missing_file_is_empty(tmp_path: Path) -> None:
    rows = [{"step": 2, "x": 1.0}, {"step": 1, "x": 5.0}, {"step": 2, "x": 3.0}, {"step": 3, "x": "text"}]
    assert series(rows, "x") == Series("x", [1, 2], [5.0, 3.0])
    assert read_metrics(tmp_path / "absent.jsonl") == []


def test_smoothed_is_the_trailing_three_step_mean() -> None:
    s = Series("k", [1, 2, 3, 4, 5], [0.0, 3.0, 6.0, 3.0, 0.0])
    assert smoothed(s) == Series("k", [3, 4, 5], [3.0, 4.0, 3.0])
    short = Series("k", [1, 2], [1.0, 2.0])
    assert smoothed(short) == short


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


SFT_ROWS = [
    {"step": 1, "train/loss": 1.4, "train/grad_norm": 2.5, "train/lr": 1e-6},
    {"step": 2, "train/loss": 1.2, "train/grad_norm": 2.0, "train/lr": 2e-6, "val/loss": 1.3},
]


def test_sft_rows_get_loss_grad_norm_and_lr_panels(tmp_path: Path) -> None:
    assert sft_series(ROWS) is None  # an RL run keeps score / response length / KL
    panels = sft_series(SFT_ROWS)
    assert panels == {
        "loss": [Series("train/loss", [1, 2], [1.4, 1.2]), Series("val/loss", [2], [1.3])],
        "grad norm": [Series("train/grad_norm", [1, 2], [2.5, 2.0])],
        "learning rate": [Series("train/lr", [1, 2], [1e-6, 2e-6])],
    }
    pytest.importorskip("matplotlib")
    out = curves.plot_metrics(SFT_ROWS, tmp_path / PNG_FILE, title="sft")
    assert png_size(out) == (15 * 110, 4 * 110)


def test_plot_writes_a_valid_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = curves.plot_metrics(ROWS, tmp_path / "sub" / PNG_FILE, title="proj/exp")
    assert out == tmp_path / "sub" / PNG_FILE
    width, height = png_size(out)
    assert (width, height) == (15 * 110, 4 * 110)  # figsize (15, 4) inches at 110 dpi
    assert 10_000 < out.stat().st_size < 2_000_000
    assert [p.name for p in out.parent.iterdir()] == [PNG_FILE]  # no temp file left behind


def test_tracking_with_file_draws_png_at_close_and_every_interval(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    tracking = Tracking("p", "e", ["file"], tmp_path, plot_interval_s=60.0)
    now = [0.0]
    assert tracking.plot is not None
    tracking.plot._clock = lambda: now[0]
    png = tmp_path / PNG_FILE
    tracking.log(ROWS[1], step=1)  # starts the interval
    now[0] = 30.0
    tracking.log(ROWS[2], step=2)
    assert not png.exists()
    now[0] = 61.0
    tracking.log(ROWS[3], step=3)
    assert png_size(png) == (1650, 440)
    first = png.read_bytes()
    tracking.log(ROWS[4], step=4)  # 0 s after the last drawing: not redrawn
    assert png.read_bytes() == first
    tracking.close()
    assert png.read_bytes() != first  # the last drawing holds step 4


def test_no_file_backend_no_png(tmp_path: Path) -> None:
    with Tracking("p", "e", ["console"], tmp_path) as tracking:
        assert tracking.plot is None
        tracking.log({"critic/score/mean": 1.0}, step=1)
    assert not (tmp_path / PNG_FILE).exists()


def test_without_matplotlib_one_info_line_and_no_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(curves, "matplotlib_available", lambda: False)
    with (
        caplog.at_level(logging.INFO, logger="verl.trainer.trackers.curves"),
        Tracking("p", "e", ["file"], tmp_path) as tracking,
    ):
        for row in ROWS[1:]:
            tracking.log(row, step=row["step"])
    messages = [r.getMessage() for r in caplog.records if r.name == "verl.trainer.trackers.curves"]
    assert len(messages) == 1 and "pip install './core[plot]'" in messages[0]
    assert not (tmp_path / PNG_FILE).exists()
    assert (tmp_path / METRICS_FILE).exists()


def test_a_failed_drawing_warns_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    write_jsonl(tmp_path / METRICS_FILE, ROWS)
    plot = MetricsPlot(tmp_path / METRICS_FILE)
    plot.enabled = True

    def broken(*args: object, **kwargs: object) -> Path:
        raise OSError("disk full")

    monkeypatch.setattr(curves, "plot_metrics", broken)
    with caplog.at_level(logging.WARNING):
        assert plot.refresh() is None
    assert any("disk full" in r.getMessage() for r in caplog.records)
