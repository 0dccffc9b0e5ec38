"""GSM8K preparation: verl's columns and wording, bad rows, the shipped copy."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.data import gsm8k
from verl.data.gsm8k import GSM8KFormatError, default_source_dir, prepare_gsm8k

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
REPO = Path(__file__).resolve().parents[3]


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def small_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    _write_jsonl(
        src / "train.jsonl",
        [
            json.dumps({"question": "What is 2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"}),
            "",  # blank lines are ignored and do not count as records
            json.dumps({"question": "Big?", "answer": "Lots.\n#### 1,234"}),
        ],
    )
    with gzip.open(src / "test.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"question": "Owe?", "answer": "Debt.\n#### -5"}) + "\n")
    return src


def test_rows_match_verl_columns(small_source: Path, tmp_path: Path) -> None:
    paths = prepare_gsm8k(tmp_path / "out", small_source)
    assert paths == {"train": tmp_path / "out" / "train.parquet", "test": tmp_path / "out" / "test.parquet"}
    train = pq.read_table(paths["train"]).to_pylist()
    assert train == [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "What is 2+2? " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "4"},
            "extra_info": {
                "split": "train",
                "index": 0,
                "answer": "2+2=<<2+2=4>>4\n#### 4",
                "question": "What is 2+2?",
            },
        },
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "Big? " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "1234"},
            "extra_info": {"split": "train", "index": 1, "answer": "Lots.\n#### 1,234", "question": "Big?"},
        },
    ]
    test = pq.read_table(paths["test"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in test] == ["-5"]
    assert test[0]["extra_info"]["split"] == "test"


def test_instruction_is_verl_wording() -> None:
    assert gsm8k.INSTRUCTION == INSTRUCTION
    assert gsm8k.extract_solution("a\n#### 1,000,000") == "1000000"


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (json.dumps({"question": "q"}), "missing field 'answer'"),
        (json.dumps({"answer": "#### 3"}), "missing field 'question'"),
        (json.dumps({"question": "q", "answer": "no final line"}), "####"),
        (json.dumps({"question": 3, "answer": "#### 3"}), "'question' must be a string"),
        ("{not json", "invalid JSON"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    good = json.dumps({"question": "q", "answer": "#### 1"})
    _write_jsonl(tmp_path / "train.jsonl", [good, line])
    _write_jsonl(tmp_path / "test.jsonl", [good])
    with pytest.raises(GSM8KFormatError) as err:
        prepare_gsm8k(tmp_path / "out", tmp_path)
    msg = str(err.value)
    assert f"{tmp_path / 'train.jsonl'}:2" in msg
    assert needle in msg
    assert "skip_bad_rows" in msg


def test_skip_bad_rows_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = [json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) for i in range(3)]
    bad = [json.dumps({"question": "q"}), "{oops"]
    _write_jsonl(tmp_path / "train.jsonl", [good[0], bad[0], good[1], bad[1], good[2]])
    _write_jsonl(tmp_path / "test.jsonl", [good[0]])
    with caplog.at_level(logging.WARNING, logger="verl.data.gsm8k"):
        paths = prepare_gsm8k(tmp_path / "out", tmp_path, skip_bad_rows=True)
    rows = pq.read_table(paths["train"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["0", "1", "2"]
    # index keeps the record's position in the source file (records 0, 2, 4).
    assert [r["extra_info"]["index"] for r in rows] == [0, 2, 4]
    assert "skipped 2 bad GSM8K row(s)" in caplog.text
    assert f"{tmp_path / 'train.jsonl'}:2" in caplog.text


def test_missing_split_names_folder(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "train.jsonl", [json.dumps({"question": "q", "answer": "#### 1"})])
    with pytest.raises(FileNotFoundError, match="'test'.*test.jsonl.gz"):
        prepare_gsm8k(tmp_path / "out", tmp_path)
    assert not (tmp_path / "out" / "train.parquet").exists()


def _count_records(path: Path) -> int:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def test_shipped_files_are_packaged_and_linked_from_examples() -> None:
    assets = Path(gsm8k.__file__).parent / "assets" / "gsm8k"
    for name in ("train.jsonl.gz", "test.jsonl.gz", "LICENSE"):
        assert (assets / name).is_file(), name
    assert "MIT License" in (assets / "LICENSE").read_text()
    total = sum((assets / n).stat().st_size for n in ("train.jsonl.gz", "test.jsonl.gz"))
    assert 1_000_000 < total < 2_500_000
    examples = REPO / "examples" / "data" / "gsm8k"
    if examples.is_dir():  # source checkout
        for name in ("train.jsonl.gz", "test.jsonl.gz", "LICENSE"):
            assert (examples / name).read_bytes() == (assets / name).read_bytes(), name
    src = default_source_dir()
    assert (src / "train.jsonl.gz").read_bytes() == (assets / "train.jsonl.gz").read_bytes()


def test_shipped_dataset_row_counts(tmp_path: Path) -> None:
    src = default_source_dir()
    # Counts published with GSM8K (openai/grade-school-math), and recounted from the files.
    assert _count_records(src / "train.jsonl.gz") == 7473
    assert _count_records(src / "test.jsonl.gz") == 1319
    paths = prepare_gsm8k(tmp_path)
    train, test = pq.read_table(paths["train"]), pq.read_table(paths["test"])
    assert (train.num_rows, test.num_rows) == (7473, 1319)
    first = train.slice(0, 1).to_pylist()[0]
    assert first["extra_info"]["question"].startswith("Natalia sold clips to 48 of her friends")
    assert first["reward_model"]["ground_truth"] == "72"
    truths = test.column("reward_model").combine_chunks().field("ground_truth").to_pylist()
    assert all(isinstance(float(t), float) for t in truths)  # every ground truth parses as a number
    assert test.column("extra_info").combine_chunks().field("index").to_pylist() == list(range(1319))


def test_checkout_without_symlinks_falls_back_to_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # git with core.symlinks=false writes each link as a small text file holding its target.
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl.gz").write_text(f"../../../core/src/verl/data/assets/gsm8k/{split}.jsonl.gz")
    monkeypatch.setattr(gsm8k, "_repo_examples_dir", lambda: tmp_path)
    assert default_source_dir() == Path(gsm8k.__file__).resolve().parent / "assets" / "gsm8k"
    monkeypatch.setattr(gsm8k, "_PACKAGE_DIR", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="--source"):
        default_source_dir()
