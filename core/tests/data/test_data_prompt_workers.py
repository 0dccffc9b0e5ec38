"""data.filter_overlong_prompts_workers: prompts rendered and tokenised in worker processes give exactly the
one-process dataset (ids, filtering, truncation counts, template errors in row order)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.data.dataset import ChatTemplateError, RLHFDataset
from verl.data.prompt_tokens import encode_prompts, encode_prompts_parallel
from verl.testing.tiny import make_tiny_tokenizer

# The chat template fails on a message containing "boom", naming it (HF's raise_exception).
TEMPLATE = (
    "{% for m in messages %}{% if 'boom' in m['content'] %}{{ raise_exception('no boom: ' + m['content']) }}"
    "{% endif %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)


@pytest.fixture(autouse=True)
def _no_prompt_cache(monkeypatch):
    """Every dataset here encodes for real (a cached second build would not exercise the workers)."""
    monkeypatch.setenv("VERL_PROMPT_CACHE", "0")


@pytest.fixture(scope="module")
def tok():
    t = make_tiny_tokenizer()
    t.chat_template = TEMPLATE
    return t


def _rows(n: int) -> list[dict]:
    words = ["ab", "hello", "boom1", "xyzxyzxyz", "a", "qwertyuiopasdf", "boom2", "cd"]
    return [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": words[i % len(words)] * (1 + i % 3)}],
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


def test_encode_prompts_returns_ids_or_the_template_error_in_order(tok):
    msgs = [[{"role": "user", "content": c}] for c in ("ab", "boom!", "c")]
    out = encode_prompts(tok, msgs, {})
    assert out[1] == "no boom: boom!"
    for i in (0, 2):  # ids of the rendered text, without special tokens
        text = tok.apply_chat_template(msgs[i], add_generation_prompt=True, tokenize=False)
        assert out[i] == tok(text, add_special_tokens=False)["input_ids"]


def test_parallel_encoding_equals_one_process(tok):
    msgs = [r["prompt"] for r in _rows(23)]
    assert encode_prompts_parallel(tok, msgs, {}, 3) == encode_prompts(tok, msgs, {})


def test_workers_must_be_a_positive_count(tok):
    with pytest.raises(ValueError, match="filter_overlong_prompts_workers"):
        encode_prompts_parallel(tok, [], {}, 0)


@pytest.mark.slow  # each dataset spawns 2 workers that import transformers (~5 s each on this box)
@pytest.mark.parametrize("mode", ["filter", "truncate"])
def test_dataset_with_workers_equals_one_process(tmp_path: Path, tok, mode):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(24)), path)
    extra = {"filter_overlong_prompts": True} if mode == "filter" else {"truncation": "left"}

    def build(workers: int) -> RLHFDataset:
        cfg = SimpleNamespace(
            max_prompt_length=24, skip_bad_rows=True, filter_overlong_prompts_workers=workers, **extra
        )
        return RLHFDataset(str(path), tok, cfg)

    one, two = build(1), build(2)
    assert len(one) == len(two) > 0
    assert one.stats == two.stats and one.num_skipped == 6  # 2 "boom" words in every 8 rows
    assert one.skipped == two.skipped
    assert (one.num_filtered if mode == "filter" else one.num_truncated) > 0
    for i in range(len(one)):
        a, b = one[i], two[i]
        assert a["input_ids"].tolist() == b["input_ids"].tolist() and a["index"] == b["index"]


@pytest.mark.slow
def test_template_error_still_raises_with_file_and_row(tmp_path: Path, tok):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(_rows(8)), path)
    cfg = SimpleNamespace(max_prompt_length=64, filter_overlong_prompts_workers=2)
    with pytest.raises(ChatTemplateError, match=r"row 2: the chat template failed on field 'prompt': no boom"):
        RLHFDataset(str(path), tok, cfg)
