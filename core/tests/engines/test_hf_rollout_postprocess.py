"""Rollout post-processing and sampling helpers on hand-written inputs (K06, K07, K09)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.engines.reference.postprocess import (
    build_rollout_batch,
    compute_position_ids,
    get_response_mask,
    response_mask_from_lengths,
)
from verl.engines.reference.sampling import (
    SamplingParams,
    filter_logits,
    resolve_sampling_params,
    select_next_tokens,
)


# ---------------------------------------------------------------- K06: response mask
@pytest.mark.parametrize(
    ("response", "eos", "pad", "expected"),
    [
        ([5, 6, 0, 0], 2, 0, [1, 1, 0, 0]),  # (a) stopped without EOS: trailing pads excluded
        ([5, 2, 0, 0], 2, 0, [1, 1, 0, 0]),  # (b) the EOS token itself stays valid
        ([5, 8, 8, 8], [7, 8], 8, [1, 1, 0, 0]),  # (c) several EOS ids, pad id == one of them
    ],
    ids=["K06a-no-eos", "K06b-eos", "K06c-multi-eos-pad-is-eos"],
)
def test_k06_response_mask_from_tokens(response, eos, pad, expected):
    mask = get_response_mask(torch.tensor([response]), eos, pad)
    assert mask.tolist() == [expected]
    assert mask.dtype == torch.int64


def test_k06_other_eos_id_of_a_set_also_stops():
    mask = get_response_mask(torch.tensor([[5, 7, 9, 8], [8, 8, 8, 8], [3, 3, 3, 3]]), [7, 8], 8)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_k06_all_pad_row_without_eos_is_empty():
    assert get_response_mask(torch.tensor([[0, 0, 0]]), 2, 0).tolist() == [[0, 0, 0]]


def test_k06_in_build_rollout_batch_uses_lengths_not_token_values():
    # (c) with the rollout's own builder: pad id 8 is also an EOS id; lengths say 2 valid tokens.
    out = build_rollout_batch(
        torch.tensor([[1, 4]]), torch.tensor([[1, 1]]), torch.tensor([[5, 8, 5, 5]]), torch.tensor([2]), 8
    )
    assert out["responses"].tolist() == [[5, 8, 8, 8]]
    assert out["response_mask"].tolist() == [[1, 1, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0]]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.lists(st.integers(3, 20), min_size=0, max_size=6), st.booleans()), min_size=1, max_size=5
    ),
)
def test_mask_from_tokens_matches_mask_from_lengths(rows):
    """Tokens avoid the pad/EOS ids except a final EOS: both mask builders agree."""
    resp_len, eos, pad = 7, 2, 0
    tokens, lengths = [], []
    for body, ends_with_eos in rows:
        seq = body + ([eos] if ends_with_eos else [])
        seq = seq[:resp_len]
        lengths.append(len(seq))
        tokens.append(seq + [pad] * (resp_len - len(seq)))
    expected = [[1] * n + [0] * (resp_len - n) for n in lengths]
    assert get_response_mask(torch.tensor(tokens), eos, pad).tolist() == expected
    assert response_mask_from_lengths(torch.tensor(lengths), resp_len).tolist() == expected


# ---------------------------------------------------------------- K07: position ids
def test_k07_position_ids_continue_through_response():
    out = build_rollout_batch(
        prompt_ids=torch.tensor([[0, 0, 11, 12, 13]]),
        prompt_mask=torch.tensor([[0, 0, 1, 1, 1]]),
        responses=torch.tensor([[21, 22]]),
        lengths=torch.tensor([2]),
        pad_token_id=0,
    )
    assert out["position_ids"][0, :5].tolist() == [0, 0, 0, 1, 2]
    assert out["position_ids"][0, 5:].tolist() == [3, 4]
    assert out["input_ids"].tolist() == [[0, 0, 11, 12, 13, 21, 22]]


def test_position_ids_formula_on_padding():
    # clip(cumsum(mask) - 1, 0): response padding repeats the last position (masked out anyway).
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert compute_position_ids(mask).tolist() == [[0, 0, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5]]


def test_build_rollout_batch_zeroes_padding_log_probs_and_pads_tokens():
    lp = torch.tensor([[-0.5, -1.0, -2.0, -3.0]], dtype=torch.float64)
    out = build_rollout_batch(
        torch.tensor([[7, 7]]), torch.tensor([[1, 1]]), torch.tensor([[4, 5, 6, 9]]), torch.tensor([2]), 3, lp
    )
    assert out["responses"].tolist() == [[4, 5, 3, 3]]
    assert out["rollout_log_probs"].dtype == torch.float32
    assert out["rollout_log_probs"].tolist() == [[-0.5, -1.0, 0.0, 0.0]]
    assert set(out) == {
        "prompts",
        "responses",
        "response_mask",
        "input_ids",
        "attention_mask",
        "position_ids",
        "rollout_log_probs",
    }


# ---------------------------------------------------------------- K09 and sampling
def test_k09_sampled_log_prob_uses_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    params = SamplingParams(do_sample=True, temperature=0.5, top_p=1.0, top_k=1)  # top-k 1 forces token 0
    tokens, logp = select_next_tokens(logits, params, torch.Generator().manual_seed(0))
    assert tokens.tolist() == [0]
    # log_softmax([4, 2, 0])[0] by hand; filtering (top-k) does not change the reported log-prob
    expected = 4.0 - math.log(math.exp(4.0) + math.exp(2.0) + 1.0)
    assert logp.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(-0.142932, abs=1e-6)


def test_k09_greedy_log_prob_is_untempered():
    params = SamplingParams(do_sample=False, temperature=0.5, top_p=1.0, top_k=-1)
    tokens, logp = select_next_tokens(torch.tensor([[2.0, 1.0, 0.0]]), params, None)
    assert tokens.tolist() == [0]
    assert logp.item() == pytest.approx(2.0 - math.log(math.exp(2.0) + math.exp(1.0) + 1.0), abs=1e-6)
    assert params.logprob_temperature == 1.0
    assert SamplingParams(do_sample=True, temperature=0.0, top_p=1.0, top_k=-1).greedy  # T = 0 means greedy


def test_top_k_and_top_p_filtering_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    inf = float("-inf")
    assert filter_logits(logits, top_k=2, top_p=1.0)[0, 2].item() == inf
    assert torch.isfinite(filter_logits(logits, top_k=2, top_p=1.0)[0, :2]).all()
    assert torch.isfinite(filter_logits(logits, top_k=-1, top_p=0.81)).all()  # needs all three to reach 0.81
    kept = torch.isfinite(filter_logits(logits, top_k=0, top_p=0.7)).tolist()
    assert kept == [[True, True, False]]  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert torch.isfinite(filter_logits(logits, top_k=-1, top_p=0.4)).tolist() == [[True, False, False]]
    shuffled = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))  # same set, other order
    assert torch.isfinite(filter_logits(shuffled, top_k=-1, top_p=0.7)).tolist() == [[False, True, True]]


def test_sampling_frequencies_follow_tempered_softmax():
    logits = torch.tensor([[1.0, 0.0, -1.0]]).repeat(20000, 1)
    params = SamplingParams(do_sample=True, temperature=2.0, top_p=1.0, top_k=-1)
    tokens, _ = select_next_tokens(logits, params, torch.Generator().manual_seed(1))
    freq = torch.bincount(tokens, minlength=3).double() / tokens.numel()
    expected = torch.softmax(torch.tensor([0.5, 0.0, -0.5], dtype=torch.float64), 0)
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)


def test_sampling_params_precedence():
    cfg = SimpleNamespace(
        do_sample=True,
        temperature=0.9,
        top_p=0.95,
        top_k=50,
        val_kwargs=SimpleNamespace(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, n=1),
    )
    assert resolve_sampling_params(cfg, {}) == SamplingParams(do_sample=True, temperature=0.9, top_p=0.95, top_k=50)
    val = resolve_sampling_params(cfg, {"validate": True})
    assert val.greedy and val.top_k == -1
    assert resolve_sampling_params(cfg, {"do_sample": False}).greedy
    assert resolve_sampling_params(cfg, {"temperature": 0.3}).temperature == 0.3
    assert resolve_sampling_params(None, None) == SamplingParams(do_sample=True, temperature=1.0, top_p=1.0, top_k=-1)
    with pytest.raises(ValueError, match="temperature"):
        resolve_sampling_params(SimpleNamespace(temperature=-1.0), {})
    with pytest.raises(ValueError, match="top_p"):
        resolve_sampling_params(SimpleNamespace(top_p=0.0), {})
