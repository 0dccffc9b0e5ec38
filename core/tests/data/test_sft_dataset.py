"""SFT rows -> ids + loss mask, checked token by token against an independent construction.

The tiny tokenizer is character level, so the expected ids of a ChatML conversation are built here by
encoding each rendered piece on its own (``<|im_start|>role\\n`` + content + ``<|im_end|>\\n``), and the
expected mask marks exactly an assistant turn's content, its ``<|im_end|>`` and the newline after it (verl's
MultiTurnSFTDataset mask). The SmolLM2 tokenizer (BPE, injected system prompt) is checked the same way when
its converted folder is cached.
"""

from __future__ import annotations

import json

import pytest
import torch

from verl.config.schema.sft import SFTDataConfig
from verl.data.sft_dataset import SFTDataset, SFTRowError, collate_sft, tokenize_conversation
from verl.testing.tiny import make_tiny_tokenizer

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6, of course"},
]


def expected(tok, messages, system_prefix: str = ""):
    """Ids and mask from the pieces: header tokens 0, an assistant turn's content + <|im_end|> + newline 1."""
    ids, mask = [], []

    def add(text, flag):
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids.extend(piece)
        mask.extend([flag] * len(piece))

    if system_prefix:
        add(system_prefix, 0)
    for m in messages:
        add(f"<|im_start|>{m['role']}\n", 0)
        flag = int(m["role"] == "assistant")
        add(m["content"], flag)
        add("<|im_end|>", flag)
        add("\n", flag)
    return ids, mask


def test_multi_turn_mask_is_every_assistant_turn_and_nothing_else():
    tok = make_tiny_tokenizer()
    ids, mask = tokenize_conversation(tok, CONVO)
    assert (ids, mask) == expected(tok, CONVO)
    # Spelled out: the trained text is the two answers with their end-of-turn tokens.
    trained = tok.decode([i for i, k in zip(ids, mask, strict=True) if k])
    assert trained == "4<|im_end|>\n6, of course<|im_end|>\n"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_single_turn_rows_equal_the_two_message_conversation(tmp_path):
    tok = make_tiny_tokenizer()
    rows = [
        {"q": "1+1?", "a": "2"},
        {"q": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], "a": "yo"},
    ]
    cfg = SFTDataConfig(prompt_key="q", response_key="a", max_length=64)
    ds = SFTDataset(_write(tmp_path / "d.jsonl", rows), tok, cfg)
    first = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    second = [*rows[1]["q"], {"role": "assistant", "content": "yo"}]
    for item, msgs in zip(ds, (first, second), strict=True):
        assert (item["input_ids"], item["loss_mask"]) == expected(tok, msgs)


def test_truncation_modes(tmp_path):
    tok = make_tiny_tokenizer()
    path = _write(tmp_path / "d.jsonl", [{"messages": CONVO[1:3]}, {"messages": CONVO}])
    full_ids, full_mask = expected(tok, CONVO)
    with pytest.raises(SFTRowError, match=r"d\.jsonl:1: \d+ tokens, longer than data\.max_length=30"):
        SFTDataset(path, tok, SFTDataConfig(max_length=30))
    for mode, cut in (("left", slice(-30, None)), ("right", slice(0, 30))):
        ds = SFTDataset(path, tok, SFTDataConfig(max_length=30, truncation=mode))
        assert ds[1] == {"input_ids": full_ids[cut], "loss_mask": full_mask[cut]}
        assert ds.truncated == 1 and len(ds[0]["input_ids"]) < 30


def test_bad_rows_name_the_row(tmp_path):
    tok = make_tiny_tokenizer()
    path = _write(tmp_path / "d.jsonl", [{"messages": CONVO}, {"messages": CONVO[:2]}])
    with pytest.raises(SFTRowError, match=r"d\.jsonl:1: the conversation has no assistant turn"):
        SFTDataset(path, tok, SFTDataConfig())
    with pytest.raises(SFTRowError, match=r"d\.jsonl:0: column data.messages_key='chat' missing"):
        SFTDataset(path, tok, SFTDataConfig(messages_key="chat"))


def test_collate_shifts_the_loss_mask_onto_the_predicted_tokens():
    items = [{"input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]}, {"input_ids": [9, 10, 11], "loss_mask": [0, 1, 1]}]
    batch = collate_sft(items, pad_id=3).batch
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 11, 3]]
    assert batch["responses"].tolist() == [[6, 7, 8], [10, 11, 3]]
    # response t scores token t+1: its mask is loss_mask[t+1], and padding never counts.
    assert batch["response_mask"].tolist() == [[0, 1, 1], [1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 2]]
    assert collate_sft(items, pad_id=3, pad_to=6).batch["input_ids"].shape == torch.Size([2, 6])


def test_smollm2_tokenizer_mask_when_cached():
    from verl.models.resolve import cache_root

    folder = cache_root() / "models" / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct is not converted in the cache (verl.models)")
    from verl.models.tokenizer import load_tokenizer

    tok = load_tokenizer(folder)
    msgs = CONVO[1:]  # no system turn: SmolLM2's template injects its own
    ids, mask = tokenize_conversation(tok, msgs)
    system = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    assert (ids, mask) == expected(tok, msgs, system_prefix=system)
