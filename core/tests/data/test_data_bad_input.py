"""Bad dataset input: every problem names the file, the row, the field and the fix; ``skip_bad_rows`` drops
and counts bad rows; overlong prompts follow ``filter_overlong_prompts`` / ``truncation`` and are counted.

Tiny parquet/jsonl files are written by each test; the tokenizer is the char-level tiny one with a bare
template (one token per content character), so prompt lengths are the content lengths.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.data.dataset import PromptFormatError, PromptTooLongError, RewardColumns, RLHFDataset
from verl.testing.tiny import make_tiny_tokenizer

BARE_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def tok():
    t = make_tiny_tokenizer()
    t.chat_template = BARE_TEMPLATE
    return t


def _row(content: str = "ab", truth: object = "7", **extra) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": truth},
        **extra,
    }


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(**kw) -> SimpleNamespace:
    return SimpleNamespace(max_prompt_length=8, **kw)


BAD_ROWS = {
    "no-prompt-column": ({"data_source": "x", "question": "q"}, "'prompt'", "data.prompt_key"),
    "prompt-null": ({"prompt": None, "reward_model": {"ground_truth": "1"}}, "'prompt'", "missing"),
    "no-messages": ({"prompt": [], "reward_model": {"ground_truth": "1"}}, "'prompt'", "non-empty list"),
    "empty-content": (_row(""), "'prompt'[0]['content']", "empty prompt"),
    "blank-content": (_row("  \n"), "'prompt'[0]['content']", "empty prompt"),
    "prompt-string": ({"prompt": "hello"}, "'prompt'", "got str"),
    "truth-list": (_row(truth=["7", "8"]), "'reward_model'.ground_truth", "got list"),
    "truth-null": (_row(truth=None), "'reward_model'.ground_truth", "got NoneType"),
    "truth-bool": (_row(truth=True), "'reward_model'.ground_truth", "got bool"),
    "truth-dict": (_row(truth={"a": 1}), "'reward_model'.ground_truth", "got dict"),
    "reward-model-str": ({**_row(), "reward_model": "7"}, "'reward_model'", "expected a dict"),
    "reward-model-null": ({**_row(), "reward_model": None}, "'reward_model'", "expected a dict"),
    "no-ground-truth": ({**_row(), "reward_model": {"style": "rule"}}, "'reward_model'", "no 'ground_truth'"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS), ids=list(BAD_ROWS))
def test_bad_row_error_names_file_row_field_and_fix(tmp_path: Path, tok, case: str) -> None:
    bad, field, needle = BAD_ROWS[case]
    path = _jsonl(tmp_path / "train.jsonl", [_row("ok"), _row("fine"), bad])
    with pytest.raises(PromptFormatError) as err:
        RLHFDataset(path, tok, _cfg())
    msg = str(err.value)
    assert str(path) in msg and "row 2" in msg, msg
    assert f"field {field}" in msg and needle in msg, msg
    assert "data.skip_bad_rows" in msg or "data.prompt_key" in msg, msg
    assert isinstance(err.value, ValueError)


def test_skip_bad_rows_drops_and_counts(tmp_path: Path, tok, caplog: pytest.LogCaptureFixture) -> None:
    rows = [_row("a"), _row(""), _row("bc", truth=None), _row("d", truth=3), {"prompt": []}, _row("ef")]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="verl.data.dataset"):
        ds = RLHFDataset(path, tok, _cfg(skip_bad_rows=True))
    # rows 1 (empty content), 2 (null truth), 4 (no messages) are bad; the integer truth 3 is accepted
    assert ds.num_skipped == 3 and len(ds) == 3 and ds.num_rows_read == 6
    assert [d["raw_prompt"][0]["content"] for d in (ds[0], ds[1], ds[2])] == ["a", "d", "ef"]
    assert ds.stats == {"data/skipped_rows": 3, "data/filtered_prompts": 0, "data/truncated_prompts": 0}
    assert len(ds.skipped) == 3 and "row 1" in ds.skipped[0] and "row 4" in ds.skipped[2]
    assert "skipped 3 of 6 rows" in caplog.text


def test_parquet_null_and_list_ground_truth_name_the_row(tmp_path: Path, tok) -> None:
    path = tmp_path / "train.parquet"
    rows = [_row("a", truth="1"), _row("b", truth=None)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(PromptFormatError, match=r"row 1, field 'reward_model'.ground_truth: .* got NoneType"):
        RLHFDataset(path, tok, _cfg())
    assert len(RLHFDataset(path, tok, _cfg(skip_bad_rows=True))) == 1


def test_all_rows_bad_is_an_error_with_counts(tmp_path: Path, tok) -> None:
    path = _jsonl(tmp_path / "train.jsonl", [_row(""), _row("")])
    with pytest.raises(ValueError, match="read 2, skipped 2 bad"):
        RLHFDataset(path, tok, _cfg(skip_bad_rows=True))


def test_missing_file_names_the_path_and_the_keys(tmp_path: Path, tok) -> None:
    path = tmp_path / "nope" / "train.parquet"
    with pytest.raises(FileNotFoundError) as err:
        RLHFDataset(str(path), tok, _cfg())
    assert str(path) in str(err.value) and "data.train_files" in str(err.value)


def test_corrupt_parquet_is_a_value_error_naming_the_file(tmp_path: Path, tok) -> None:
    path = tmp_path / "train.parquet"
    path.write_bytes(b"this is not parquet at all")
    with pytest.raises(ValueError, match="cannot read .*train.parquet as parquet") as err:
        RLHFDataset(path, tok, _cfg())
    assert "corrupt or not parquet" in str(err.value)


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("train.csv", b"a,b\n", "unsupported dataset file"),
        ("train.jsonl", b"\xff\xfe\x00garbage\n", "cannot read .* as UTF-8 jsonl"),
        ("train.jsonl", b'{"prompt": 1}\n[1, 2]\n', r"train.jsonl:2: expected a JSON object"),
        ("train.jsonl", b"{oops\n", r"train.jsonl:1: invalid JSON"),
    ],
)
def test_unreadable_files(tmp_path: Path, tok, name: str, content: bytes, needle: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=needle):
        RLHFDataset(path, tok, _cfg())


def test_folder_instead_of_file(tmp_path: Path, tok) -> None:
    with pytest.raises(ValueError, match="is a folder"):
        RLHFDataset(tmp_path, tok, _cfg())


def test_bad_row_is_never_skipped_silently_by_default(tmp_path: Path, tok) -> None:
    path = _jsonl(tmp_path / "train.jsonl", [_row("a"), _row("")])
    with pytest.raises(PromptFormatError):
        RLHFDataset(path, tok, _cfg(skip_bad_rows=False))


# ------------------------------------------------------------------ overlong prompts (verl semantics)
LENGTHS = [3, 8, 9, 12, 2]  # max_prompt_length 8: rows 2 and 3 are too long


def _overlong(tmp_path: Path) -> Path:
    return _jsonl(tmp_path / "long.jsonl", [_row("x" * n) for n in LENGTHS])


def test_filter_overlong_counts_and_logs(tmp_path: Path, tok, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="verl.data.dataset"):
        ds = RLHFDataset(_overlong(tmp_path), tok, _cfg(filter_overlong_prompts=True, truncation="left"))
    assert len(ds) == 3 and ds.num_filtered == 2 and ds.num_truncated == 0
    assert [int(ds[i]["attention_mask"].sum()) for i in range(3)] == [3, 8, 2]
    assert ds.stats["data/filtered_prompts"] == 2
    assert "filtered 2 of 5 prompts longer than max_prompt_length=8" in caplog.text


@pytest.mark.parametrize(
    ("mode", "expected"),
    # verl's tokenize_and_postprocess_data: left keeps the tail, right the head, middle head[:4] + tail[-4:]
    [("left", "efghijkl"), ("right", "abcdefgh"), ("middle", "abcdijkl")],
)
def test_truncation_counts_and_cuts_like_verl(tmp_path: Path, tok, mode: str, expected: str) -> None:
    content = "abcdefghijkl"  # 12 tokens
    path = _jsonl(tmp_path / "t.jsonl", [_row(content), _row("ab"), _row("abcdefghi")])
    ds = RLHFDataset(path, tok, _cfg(truncation=mode))
    assert ds.num_truncated == 2 and ds.num_filtered == 0 and len(ds) == 3
    assert tok.decode(ds[0]["input_ids"][ds[0]["attention_mask"].bool()]) == expected
    assert ds.stats["data/truncated_prompts"] == 2


def test_truncation_error_names_row_length_and_fixes(tmp_path: Path, tok) -> None:
    with pytest.raises(PromptTooLongError) as err:
        RLHFDataset(_overlong(tmp_path), tok, _cfg(truncation="error"))
    msg = str(err.value)
    assert "row 2" in msg and "9 tokens > data.max_prompt_length=8" in msg
    assert "filter_overlong_prompts" in msg and "truncation=left|right|middle" in msg


def test_filter_wins_over_truncation_error_and_exact_length_is_kept(tmp_path: Path, tok) -> None:
    ds = RLHFDataset(_overlong(tmp_path), tok, _cfg(filter_overlong_prompts=True, truncation="error"))
    assert ds.num_filtered == 2 and len(ds) == 3  # 8 tokens == max_prompt_length is not overlong


def test_skip_bad_rows_is_a_config_key() -> None:
    from verl.config import load_config

    assert load_config().data.skip_bad_rows is False
    assert load_config(overrides=["data.skip_bad_rows=true"]).data.skip_bad_rows is True


# ------------------------------------------------------------------------------- reward columns at load time
def _builtin_only(source: str) -> None:
    if source not in ("openai/gsm8k",):
        raise ValueError(f"no built-in reward function for data_source={source!r}; set custom_reward_function.path")


BUILTIN = RewardColumns(check_source=_builtin_only, reader="the reward manager")


def _without(row: dict, column: str) -> dict:
    return {k: v for k, v in row.items() if k != column}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("column", ["reward_model", "data_source"])
def test_a_file_without_a_reward_column_fails_at_load_naming_file_column_and_fix(tmp_path, tok, column, suffix):
    rows = [_without(_row("ab"), column), _without(_row("cd"), column)]
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        _jsonl(path, rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    for skip in (False, True):  # a file-level problem: skipping rows cannot help
        with pytest.raises(PromptFormatError) as info:
            RLHFDataset(str(path), tok, _cfg(skip_bad_rows=skip), reward_columns=BUILTIN)
        msg = str(info.value)
        assert msg.startswith(f"{path}: no {column!r} column"), msg
        assert "the reward manager reads it from every row" in msg and "add a" in msg, msg
        if column == "reward_model":
            assert "'ground_truth'" in msg and "verl data gsm8k" in msg, msg
        else:
            assert "data.reward_fn_key" in msg, msg
    # Without the reward check (a run scored by a reward model alone) the same file loads.
    if column == "reward_model":
        assert len(RLHFDataset(str(path), tok, _cfg())) == 2


def test_one_row_without_the_column_is_named_and_can_be_skipped(tmp_path, tok, caplog):
    path = _jsonl(tmp_path / "t.jsonl", [_row("ab"), _without(_row("cd"), "reward_model"), _row("ef")])
    with pytest.raises(PromptFormatError, match=r"t.jsonl row 1, field 'reward_model': missing or null"):
        RLHFDataset(str(path), tok, _cfg(), reward_columns=BUILTIN)
    with caplog.at_level(logging.WARNING):
        ds = RLHFDataset(str(path), tok, _cfg(skip_bad_rows=True), reward_columns=BUILTIN)
    assert len(ds) == 2 and ds.num_skipped == 1


def test_a_data_source_no_scorer_knows_fails_at_load(tmp_path, tok):
    path = _jsonl(tmp_path / "t.jsonl", [_row("ab"), {**_row("cd"), "data_source": "my/set"}])
    with pytest.raises(PromptFormatError) as info:
        RLHFDataset(str(path), tok, _cfg(skip_bad_rows=True), reward_columns=BUILTIN)
    assert str(info.value).startswith(f"{path} row 1, field 'data_source': no built-in reward function")
    # A custom reward function (no check_source) gets whatever data source the rows name.
    assert len(RLHFDataset(str(path), tok, _cfg(), reward_columns=RewardColumns())) == 2


def test_reward_fn_key_and_extra_columns_are_what_is_checked(tmp_path, tok):
    rows = [{**_without(_row("ab"), "data_source"), "source": "openai/gsm8k"}]
    path = _jsonl(tmp_path / "t.jsonl", rows)
    spec = RewardColumns(source_key="source", check_source=_builtin_only)
    assert len(RLHFDataset(str(path), tok, _cfg(), reward_columns=spec)) == 1
    # Validation also groups its metrics by data_source.
    val = RewardColumns(source_key="source", also=("data_source",))
    with pytest.raises(PromptFormatError, match=r"no 'data_source' column"):
        RLHFDataset(str(path), tok, _cfg(), reward_columns=val)
