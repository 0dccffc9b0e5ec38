"""verl.testing.batches.ragged_rl_batch: the padding layout the engine tests rely on, checked by hand."""

from __future__ import annotations

import pytest
import torch

from verl.testing.batches import PAD_ID, ragged_rl_batch


def test_layout_masks_and_positions_by_hand() -> None:
    data = ragged_rl_batch([2, 3], [1, 0], prompt_len=3, response_len=2, generator=torch.Generator().manual_seed(0))
    b = data.batch
    assert b["attention_mask"].tolist() == [[0, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    assert b["response_mask"].tolist() == [[1, 0], [0, 0]]
    assert b["position_ids"].tolist() == [[0, 0, 1, 2, 2], [0, 1, 2, 2, 2]]
    assert b["prompts"][0, 0] == PAD_ID and b["responses"][0, 1] == PAD_ID and (b["responses"][1] == PAD_ID).all()
    real = b["input_ids"][b["attention_mask"].bool()]
    assert bool(((real >= 4) & (real < 100)).all())
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))


def test_same_seed_same_tokens_and_the_generator_continues() -> None:
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = ragged_rl_batch([3, 1], [2, 2], 3, 2, g1)
    b = ragged_rl_batch([3, 1], [2, 2], 3, 2, g2)
    assert torch.equal(a.batch["input_ids"], b.batch["input_ids"])
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


@pytest.mark.parametrize(
    ("prompt_lens", "response_lens", "match"),
    [([1, 2], [1], "2 rows but response_lens has 1"), ([4], [1], "must fit"), ([1], [3], "must fit")],
)
def test_bad_lengths_are_refused(prompt_lens, response_lens, match) -> None:
    with pytest.raises(ValueError, match=match):
        ragged_rl_batch(prompt_lens, response_lens, 3, 2, torch.Generator())
