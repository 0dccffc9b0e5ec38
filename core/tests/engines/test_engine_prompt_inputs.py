"""verl.engines.prompts: the per-row inputs every token-in rollout engine derives from the trainer's batch."""

from __future__ import annotations

import json

import pytest
import torch

from verl.engines.prompts import eos_token_ids, row_seeds, strip_left_padding


def test_strip_left_padding_keeps_exactly_the_masked_tokens() -> None:
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert strip_left_padding(ids, mask) == [[5, 6], [7, 8, 9, 10]]


def test_row_seeds_by_source() -> None:
    mod = 1 << 63
    assert row_seeds(2, torch.tensor([3, -1]), 9, greedy=False) == [3, mod - 1]  # per-row seeds win, mod 2**63
    assert row_seeds(3, None, 2, greedy=False) == [2 * 1_000_003 + i for i in range(3)]
    assert row_seeds(2, torch.tensor([3, 4]), 9, greedy=True) == [None, None]
    assert row_seeds(2, None, None, greedy=False) == [None, None]  # the engine's own generator
    # An engine without an engine-wide generator: seeds continue from the rows it sampled before.
    assert row_seeds(2, None, None, greedy=False, engine_seed=5, offset=4) == [5 * 1_000_003 + 4, 5 * 1_000_003 + 5]
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        row_seeds(2, torch.tensor([1, 2, 3]), None, greedy=False)


class _Tok:
    eos_token_id = 2


def test_eos_ids_join_the_tokenizer_and_the_generation_config_without_repeats(tmp_path) -> None:
    assert eos_token_ids(_Tok(), tmp_path) == [2]  # no generation_config.json: the tokenizer's alone
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, 7, 9]}))
    assert eos_token_ids(_Tok(), tmp_path) == [2, 7, 9]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 11}))
    assert eos_token_ids(_Tok(), tmp_path) == [2, 11]
