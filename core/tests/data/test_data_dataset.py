"""RLHFDataset with the tiny char-level tokenizer: padding, position ids, filtering, truncation, errors.

With the ChatML template, a one-message prompt renders as
``<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n``: 3 special tokens + "user\\n" (5)
+ "\\n" (1) + "assistant\\n" (10) = 19 tokens + one token per content character.
Tests that need exact short lengths use a bare template that renders only the content.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verl.data.dataset import (
    ChatTemplateError,
    PromptFormatError,
    PromptTooLongError,
    RLHFDataset,
    collate_fn,
    collate_to_dicts,
    compute_position_ids,
)
from verl.testing.tiny import make_tiny_tokenizer

BARE_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PAD = 3  # <pad> id of the tiny tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def bare_tok():
    t = make_tiny_tokenizer()
    t.chat_template = BARE_TEMPLATE
    return t


def _row(content: str, i: int, **extra) -> dict:
    return {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": 100 + i},
        **extra,
    }


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _cfg(**kw) -> SimpleNamespace:
    return SimpleNamespace(**kw)


def test_k07_position_ids_of_left_padded_mask() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    assert compute_position_ids(mask).tolist() == [[0, 0, 0, 1, 2]]


def test_k07_through_the_dataset(tmp_path: Path, bare_tok) -> None:
    ds = RLHFDataset(_parquet(tmp_path / "d.parquet", [_row("abc", 0)]), bare_tok, _cfg(max_prompt_length=5))
    item = ds[0]
    a, b, c = (bare_tok.convert_tokens_to_ids(ch) for ch in "abc")
    assert item["input_ids"].tolist() == [PAD, PAD, a, b, c]
    assert item["attention_mask"].tolist() == [0, 0, 1, 1, 1]
    assert item["position_ids"].tolist() == [0, 0, 0, 1, 2]
    assert item["input_ids"].dtype == item["attention_mask"].dtype == item["position_ids"].dtype == torch.int64


def test_chat_template_left_padding_and_columns(tmp_path: Path, tok) -> None:
    rows = [_row("ab", 0), _row("hello", 1)]
    ds = RLHFDataset(_parquet(tmp_path / "d.parquet", rows), tok, _cfg(max_prompt_length=30))
    assert len(ds) == 2
    item = ds[0]
    n_real = 19 + 2
    assert item["input_ids"].shape == (30,)
    assert item["attention_mask"].tolist() == [0] * (30 - n_real) + [1] * n_real
    assert item["input_ids"][: 30 - n_real].tolist() == [PAD] * (30 - n_real)
    assert tok.decode(item["input_ids"][30 - n_real :]) == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    assert item["position_ids"].tolist() == [0] * (30 - n_real) + list(range(n_real))
    assert item["raw_prompt"] == [{"role": "user", "content": "ab"}]
    assert item["data_source"] == "toy"
    assert item["ability"] == "math"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert item["extra_info"] == {"split": "train", "index": 100}
    assert item["index"] == 100
    assert "prompt" not in item
    assert ds.num_filtered == 0 and ds.num_truncated == 0


def test_filter_overlong_prompts(tmp_path: Path, bare_tok, caplog: pytest.LogCaptureFixture) -> None:
    rows = [_row("a", 0), _row("abcde", 1), _row("abcdefghij", 2), _row("abcdef", 3)]
    with caplog.at_level(logging.WARNING, logger="verl.data.dataset"):
        ds = RLHFDataset(
            _parquet(tmp_path / "d.parquet", rows),
            bare_tok,
            _cfg(max_prompt_length=5, filter_overlong_prompts=True, truncation="left"),
        )
    # lengths 1, 5, 10, 6 vs max 5: rows 2 and 3 go; filtering wins over truncation.
    assert (len(ds), ds.num_filtered, ds.num_truncated) == (2, 2, 0)
    assert [ds[i]["index"] for i in range(2)] == [100, 101]
    assert "filtered 2 of 4 prompts" in caplog.text


@pytest.mark.parametrize(
    ("mode", "kept"),
    [("left", "6789"), ("right", "0123"), ("middle", "0189")],
)
def test_truncation_modes(tmp_path: Path, bare_tok, mode: str, kept: str) -> None:
    rows = [_row("0123456789", 0), _row("ab", 1), _row("abcdefg", 2)]
    ds = RLHFDataset(_parquet(tmp_path / "d.parquet", rows), bare_tok, _cfg(max_prompt_length=4, truncation=mode))
    assert (len(ds), ds.num_truncated, ds.num_filtered) == (3, 2, 0)
    assert bare_tok.decode(ds[0]["input_ids"]) == kept
    assert ds[0]["attention_mask"].tolist() == [1, 1, 1, 1]
    assert ds[0]["position_ids"].tolist() == [0, 1, 2, 3]
    assert ds[1]["attention_mask"].tolist() == [0, 0, 1, 1]


def test_truncation_error_names_row_and_lengths(tmp_path: Path, bare_tok) -> None:
    path = _parquet(tmp_path / "d.parquet", [_row("ab", 0), _row("0123456789", 1)])
    with pytest.raises(PromptTooLongError) as err:
        RLHFDataset(path, bare_tok, _cfg(max_prompt_length=4))  # truncation defaults to "error", as in verl
    msg = str(err.value)
    assert str(path) in msg and "row 1" in msg
    assert "10 tokens" in msg and "max_prompt_length=4" in msg
    assert "filter_overlong_prompts" in msg


def test_unknown_truncation_mode(tmp_path: Path, bare_tok) -> None:
    with pytest.raises(ValueError, match="truncation='top'"):
        RLHFDataset(_parquet(tmp_path / "d.parquet", [_row("a", 0)]), bare_tok, _cfg(truncation="top"))


def test_missing_prompt_column(tmp_path: Path, tok) -> None:
    path = _parquet(tmp_path / "d.parquet", [{"question": "q", "data_source": "x"}])
    with pytest.raises(PromptFormatError) as err:
        RLHFDataset(path, tok, _cfg())
    msg = str(err.value)
    assert str(path) in msg and "row 0" in msg and "'prompt'" in msg and "question" in msg


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [("just a string", "got str"), ([], "non-empty list"), ([{"role": "user"}], "'prompt'[0]")],
)
def test_wrong_prompt_type(tmp_path: Path, tok, prompt, needle: str) -> None:
    path = tmp_path / "d.jsonl"
    rows = [_row("fine", 0), {"data_source": "x", "prompt": prompt}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PromptFormatError) as err:
        RLHFDataset(path, tok, _cfg())
    msg = str(err.value)
    assert str(path) in msg and "row 1" in msg and needle in msg


def test_tokenizer_without_chat_template(tmp_path: Path) -> None:
    t = make_tiny_tokenizer()
    t.chat_template = None
    t.name_or_path = "my-base-model"
    with pytest.raises(ChatTemplateError) as err:
        RLHFDataset(_parquet(tmp_path / "d.parquet", [_row("a", 0)]), t, _cfg())
    msg = str(err.value)
    assert "my-base-model" in msg and "chat_template" in msg and "instruct" in msg


def test_jsonl_multiple_files_max_samples_and_options(tmp_path: Path, tok) -> None:
    a = _parquet(tmp_path / "a.parquet", [_row("x", 0), _row("y", 1)])
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"data_source": "j", "prompt": [{"role": "user", "content": "z"}]}) + "\n")
    template = "{{ prefix }}" + BARE_TEMPLATE
    t = make_tiny_tokenizer()
    t.chat_template = template
    cfg = {"max_prompt_length": 4, "return_raw_chat": False, "apply_chat_template_kwargs": {"prefix": "Q:"}}
    ds = RLHFDataset([a, b], t, cfg)
    assert len(ds) == 3
    assert [t.decode(ds[i]["input_ids"][1:]) for i in range(3)] == ["Q:x", "Q:y", "Q:z"]
    assert "raw_prompt" not in ds[0]
    # the jsonl row has no extra_info: missing columns are None, index falls back to the row position
    assert ds[2]["extra_info"] is None and ds[2]["index"] == 2
    assert ds[2]["data_source"] == "j"
    assert len(RLHFDataset([a, b], t, cfg, max_samples=2)) == 2


def test_collate_to_dicts(tmp_path: Path, tok) -> None:
    ds = RLHFDataset(_parquet(tmp_path / "d.parquet", [_row("ab", 0), _row("cde", 1)]), tok, _cfg(max_prompt_length=24))
    tensors, non_tensors = collate_to_dicts([ds[0], ds[1]])
    assert set(tensors) == {"input_ids", "attention_mask", "position_ids"}
    assert tensors["input_ids"].shape == (2, 24) and tensors["input_ids"].dtype == torch.int64
    assert tensors["attention_mask"].sum(-1).tolist() == [21, 22]
    for key in ("data_source", "ability", "reward_model", "extra_info", "index", "raw_prompt"):
        assert non_tensors[key].dtype == object and non_tensors[key].shape == (2,), key
    assert non_tensors["raw_prompt"][1] == [{"role": "user", "content": "cde"}]
    assert non_tensors["reward_model"][1]["ground_truth"] == "1"
    assert list(non_tensors["index"]) == [100, 101]


def test_collate_fn_builds_dataproto(tmp_path: Path, tok) -> None:
    from verl.protocol import DataProto

    ds = RLHFDataset(_parquet(tmp_path / "d.parquet", [_row("ab", 0), _row("cde", 1)]), tok, _cfg(max_prompt_length=24))
    batch = collate_fn([ds[0], ds[1]])
    assert isinstance(batch, DataProto) and len(batch) == 2
    assert torch.equal(batch.batch["input_ids"][1], ds[1]["input_ids"])
    assert isinstance(batch.non_tensor_batch["data_source"], np.ndarray)
    assert batch.non_tensor_batch["data_source"].dtype == object
    assert list(batch.non_tensor_batch["data_source"]) == ["toy", "toy"]
