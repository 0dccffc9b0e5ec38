"""``verl data gsm8k`` through the real ``verl`` entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.cli.main import main


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) + "\n" for i in range(3))
    )
    (src / "test.jsonl").write_text(json.dumps({"question": "t", "answer": "#### 9"}) + "\n")
    return src


def test_writes_parquet_and_prints_counts(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["data", "gsm8k", "--out", str(out), "--source", str(source)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"train: {out / 'train.parquet'} (3 rows)", f"test: {out / 'test.parquet'} (1 rows)"]
    assert pq.read_table(out / "test.parquet").to_pylist()[0]["reward_model"]["ground_truth"] == "9"


def test_bad_rows_fail_then_skip(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture) -> None:
    with open(source / "train.jsonl", "a") as f:
        f.write('{"question": "no answer"}\n')
    out = tmp_path / "out"
    assert main(["data", "gsm8k", "--out", str(out), "--source", str(source)]) == 1
    err = capsys.readouterr().err
    assert f"{source / 'train.jsonl'}:4" in err and "'answer'" in err
    assert main(["data", "gsm8k", "--out", str(out), "--source", str(source), "--skip-bad-rows"]) == 0
    assert "(3 rows)" in capsys.readouterr().out


def test_missing_source_and_missing_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "gsm8k", "--out", str(tmp_path / "o"), "--source", str(tmp_path / "nope")]) == 1
    assert "train.jsonl.gz" in capsys.readouterr().err
    assert main(["data"]) == 2
    assert "gsm8k" in capsys.readouterr().err


def test_default_out_dir_is_home_data_gsm8k(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["data", "gsm8k", "--source", str(source)]) == 0
    assert (tmp_path / "data" / "gsm8k" / "train.parquet").is_file()
