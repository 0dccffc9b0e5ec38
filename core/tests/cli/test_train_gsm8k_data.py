"""``verl train`` writes the GSM8K parquet files a config points at when they are missing from the default
folders (``~/data/gsm8k``: plain rows; ``~/data/gsm8k_tool_<NAME>``: the tool rows), and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.cli import train_cmd
from verl.data import gsm8k


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in a temp folder, and a 2-row GSM8K source standing in for the shipped one (faster)."""
    src = tmp_path / "src"
    src.mkdir()
    for split, n in (("train", 2), ("test", 1)):
        lines = [json.dumps({"question": f"{split}{i}", "answer": f"#### {i}"}) for i in range(n)]
        (src / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(gsm8k, "default_source_dir", lambda: src)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _files(folder: Path) -> list[str]:
    return [str(folder / "train.parquet"), str(folder / "test.parquet")]


def test_tool_folder_gets_tool_rows(home: Path, capsys: pytest.CaptureFixture) -> None:
    folder = home / "data" / "gsm8k_tool_code_interpreter"
    train_cmd._ensure_gsm8k(_files(folder))
    rows = pq.read_table(folder / "train.parquet").to_pylist()
    assert [r["extra_info"]["tools_kwargs"] for r in rows] == [{"code_interpreter": {"create_kwargs": None}}] * 2
    assert pq.read_table(folder / "test.parquet").num_rows == 1
    assert f"preparing GSM8K parquet files in {folder} (verl data gsm8k --tools code_interpreter)" in (
        capsys.readouterr().err
    )
    assert not (home / "data" / "gsm8k").exists()


def test_plain_and_calc_folders_each_get_their_rows(home: Path) -> None:
    plain, calc = home / "data" / "gsm8k", home / "data" / "gsm8k_tool_calc_gsm8k_reward"
    train_cmd._ensure_gsm8k([str(plain / "train.parquet"), str(calc / "test.parquet")])
    assert "agent_name" not in pq.read_schema(plain / "train.parquet").names
    calc_rows = pq.read_table(calc / "test.parquet").to_pylist()
    assert calc_rows[0]["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "0"}}}
    # the whole folder is written, not only the file asked for
    assert (plain / "test.parquet").is_file() and (calc / "train.parquet").is_file()


def test_a_missing_file_elsewhere_prepares_nothing(home: Path, tmp_path: Path) -> None:
    folder = home / "data" / "gsm8k_tool_code_interpreter"
    other = tmp_path / "mine" / "train.parquet"
    train_cmd._ensure_gsm8k([*_files(folder), str(other)])
    assert not folder.exists() and not other.exists()
    # a folder that only looks like a tool folder is not one
    lookalike = home / "data" / "gsm8k_tool_calculator"
    train_cmd._ensure_gsm8k(_files(lookalike))
    assert not lookalike.exists()


def test_existing_files_are_left_alone(home: Path) -> None:
    folder = home / "data" / "gsm8k_tool_code_interpreter"
    folder.mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (folder / name).write_text("mine")
    train_cmd._ensure_gsm8k(_files(folder))
    assert [(folder / n).read_text() for n in ("train.parquet", "test.parquet")] == ["mine", "mine"]
