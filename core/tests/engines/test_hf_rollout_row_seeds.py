"""Per-row sampler seeds (``sample_seed``): a row's sample does not depend on its batch-mates.

This is what makes a 2-rank data-parallel rollout sample exactly what the 1-rank run samples.
"""

from __future__ import annotations

import pytest
import torch

from verl.engines.reference.rollout import build_hf_rollout
from verl.engines.reference.sampling import SamplingParams, select_next_tokens
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.conformance import make_rollout_config
from verl.testing.tiny import save_tiny_model

PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with words", "x", "12 + 30 ="]


def _cfg(**kw):
    return make_rollout_config(response_length=10, temperature=1.3, **kw)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    tok = load_tokenizer(path)
    return path, tok


def _batch(tok, texts, seeds):
    enc = tok(texts, padding=True, return_tensors="pt")
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "sample_seed": torch.tensor(seeds, dtype=torch.int64),
        }
    )


def _responses_by_text(tok, out):
    """{prompt text: response text} — rows are compared by content, independent of padding widths."""
    prompts = tok.batch_decode(out.batch["prompts"], skip_special_tokens=True)
    responses = tok.batch_decode(out.batch["responses"], skip_special_tokens=True)
    return dict(zip(prompts, responses, strict=True))


def test_per_row_generators_match_independent_multinomial_draws() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    params = SamplingParams(do_sample=True, temperature=0.8, top_p=1.0, top_k=-1)
    gens = [torch.Generator().manual_seed(s) for s in (11, 22, 33)]
    tokens, logp = select_next_tokens(logits, params, gens)
    probs = torch.softmax(logits / 0.8, dim=-1)
    expected = [
        int(torch.multinomial(probs[i], 1, generator=torch.Generator().manual_seed(s)))
        for i, s in enumerate((11, 22, 33))
    ]
    assert tokens.tolist() == expected
    want = torch.log_softmax(logits / 0.8, -1).gather(-1, torch.tensor(expected)[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, want)
    with pytest.raises(ValueError, match="2 generators for 3 rows"):
        select_next_tokens(logits, params, gens[:2])


def test_split_batches_sample_what_the_whole_batch_samples(setup) -> None:
    path, tok = setup
    engine = build_hf_rollout(_cfg(), str(path), tok)
    seeds = [1000 + i for i in range(len(PROMPTS))]
    whole = _responses_by_text(tok, engine.generate(_batch(tok, PROMPTS, seeds)))
    # The halves a 2-rank split would see, generated in reverse order with another call seed in between.
    second = _responses_by_text(tok, engine.generate(_batch(tok, PROMPTS[3:], seeds[3:])))
    first = _responses_by_text(tok, engine.generate(_batch(tok, PROMPTS[:3], seeds[:3])))
    assert {**first, **second} == whole
    # Different seeds do change the samples (the test could not pass with a constant sampler).
    other = _responses_by_text(tok, engine.generate(_batch(tok, PROMPTS, [s + 7 for s in seeds])))
    assert other != whole


def test_chunking_by_max_num_seqs_does_not_change_samples(setup) -> None:
    path, tok = setup
    seeds = list(range(len(PROMPTS)))
    one = build_hf_rollout(_cfg(), str(path), tok).generate(_batch(tok, PROMPTS, seeds))
    chunked = build_hf_rollout(_cfg(max_num_seqs=2), str(path), tok).generate(_batch(tok, PROMPTS, seeds))
    assert torch.equal(one.batch["responses"], chunked.batch["responses"])
