"""``verl data gsm8k --tools [NAME]`` through the real ``verl`` entry point."""

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


def _tools_kwargs(path: Path) -> list[dict]:
    return [r["extra_info"]["tools_kwargs"] for r in pq.read_table(path).to_pylist()]


def test_tools_without_a_name_is_code_interpreter(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    # --tools with no value, followed by another option: the default tool
    assert main(["data", "gsm8k", "--tools", "--out", str(out), "--source", str(source)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"train: {out / 'train.parquet'} (3 rows)", f"test: {out / 'test.parquet'} (1 rows)"]
    assert _tools_kwargs(out / "test.parquet") == [{"code_interpreter": {"create_kwargs": None}}]
    row = pq.read_table(out / "train.parquet").to_pylist()[2]
    assert row["agent_name"] == "tool_agent" and [m["role"] for m in row["prompt"]] == ["system", "user"]


def test_tools_calc_gsm8k_reward(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "out"
    assert main(["data", "gsm8k", "--out", str(out), "--source", str(source), "--tools", "calc_gsm8k_reward"]) == 0
    assert _tools_kwargs(out / "train.parquet") == [
        {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": str(i)}}} for i in range(3)
    ]


def test_default_out_dir_follows_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["data", "gsm8k", "--source", str(source), "--tools"]) == 0
    assert main(["data", "gsm8k", "--source", str(source), "--tools", "calc_gsm8k_reward"]) == 0
    data = tmp_path / "data"
    assert sorted(p.name for p in data.iterdir()) == ["gsm8k_tool_calc_gsm8k_reward", "gsm8k_tool_code_interpreter"]
    for folder in data.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["test.parquet", "train.parquet"]
    assert main(["data", "gsm8k", "--source", str(source)]) == 0  # without --tools: verl's ~/data/gsm8k, plain rows
    assert "agent_name" not in pq.read_schema(data / "gsm8k" / "train.parquet").names


def test_unknown_tool_is_a_usage_error(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "gsm8k", "--out", str(tmp_path / "o"), "--source", str(source), "--tools", "calculator"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--tools" in err and "'calculator'" in err and "code_interpreter" in err and "calc_gsm8k_reward" in err
    assert not (tmp_path / "o").exists()


def test_help_names_the_tools_and_their_folders(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["data", "gsm8k", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--tools [NAME]" in text
    assert "code_interpreter or calc_gsm8k_reward (default code_interpreter)" in text
    assert "default: ~/data/gsm8k, as in verl; with --tools NAME: ~/data/gsm8k_tool_NAME" in text
