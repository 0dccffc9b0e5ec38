"""verl_megatron.forward by hand: verl's layout -> right padding, the scored positions, the mask, padding to a
length; vocabulary-slice log-probs and entropy against torch's on the full vocabulary, padding columns masked."""

from __future__ import annotations

import pytest
import torch
from verl_megatron.forward import to_megatron_inputs, vocab_parallel_stats

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


def _batch():
    # Row 0: prompt [_, 5, 6] + response [7, 8]; row 1: prompt [9, 10, 11] + response [12, _].
    input_ids = torch.tensor([[0, 5, 6, 7, 8], [9, 10, 11, 12, 0]])
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, 3:]}


def test_rows_move_to_right_padding_and_score_the_right_positions():
    inputs = to_megatron_inputs(_batch(), torch.device("cpu"))
    assert inputs.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3]] * 2
    # Response token t is scored by the logit at (real prompt tokens - 1 + t): row 0 has 2, row 1 has 3.
    assert inputs.score_index.tolist() == [[1, 2], [2, 3]]
    assert inputs.response_valid.tolist() == [[True, True], [True, False]]
    causal = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    assert torch.equal(inputs.attention_mask[0, 0], causal) and torch.equal(inputs.attention_mask[1, 0], causal)


def test_pad_to_adds_masked_columns():
    inputs = to_megatron_inputs(_batch(), torch.device("cpu"), pad_to=6)
    assert inputs.input_ids.tolist() == [[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 0, 0]]
    assert bool(inputs.attention_mask[:, 0, :, 4:].all())  # padding keys are masked for every query
    assert inputs.score_index.tolist() == [[1, 2], [2, 3]]


def test_vocab_stats_equal_torch_and_ignore_padding_columns():
    from verl_megatron import parallel

    parallel.initialize(parallel.ParallelLayout())
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 10, generator=gen)  # 10 columns, the last 2 are vocabulary padding
    labels = torch.randint(0, 8, (3, 5), generator=gen)
    lp, ent = vocab_parallel_stats(logits, labels, vocab_start=0, vocab_size=8, temperature=0.7, calculate_entropy=True)
    ref = torch.log_softmax(logits[..., :8] / 0.7, dim=-1)
    torch.testing.assert_close(lp, ref.gather(-1, labels.unsqueeze(-1)).squeeze(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, -(ref.exp() * ref).sum(-1), atol=1e-6, rtol=0)
