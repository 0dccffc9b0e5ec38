"""The hf engine's fast paths change no result.

* prefill without the prompt columns that are padding in every row;
* the preallocated KV cache (instead of transformers' concatenating ``DynamicCache``);
* the GQA decode attention (instead of ``sdpa`` with repeated key/value heads);
* the ``(W @ x^T)^T`` form of the decode step's few-row linears;
* inverse-CDF sampling from one uniform draw per row and step (instead of one ``multinomial`` per row);
* one prefill per distinct prompt, its keys and values copied to the rows sharing it (GRPO's n samples).

The first four and the last are compared against the engine with each of them switched off (same tokens, same
log-probs to float tolerance); the sampler against its definition.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from verl.engines import attention
from verl.engines.reference import decode_linears, kv_cache
from verl.engines.reference import rollout as rollout_module
from verl.engines.reference.rollout import build_hf_rollout
from verl.engines.reference.sampling import SamplingParams, inverse_cdf_sample, select_next_tokens
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.conformance import make_rollout_config
from verl.testing.tiny import save_tiny_model

PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with words", "x", "12 + 30 ="]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import GenerationConfig

    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    # Many stop tokens, so that rows finish at different steps and are dropped from the running batch.
    gen = GenerationConfig.from_pretrained(path)
    gen.eos_token_id = [2, 22, 32, *range(10, 104, 9)]
    gen.save_pretrained(path)
    return path, load_tokenizer(path)


def _batch(tok, extra_left_pad: int = 0) -> DataProto:
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if extra_left_pad:  # as the dataset does: every row left-padded to max_prompt_length
        ids = torch.cat([torch.full((len(PROMPTS), extra_left_pad), tok.pad_token_id), ids], dim=1)
        mask = torch.cat([torch.zeros(len(PROMPTS), extra_left_pad, dtype=mask.dtype), mask], dim=1)
    seeds = torch.arange(len(PROMPTS), dtype=torch.int64) + 7
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "sample_seed": seeds})


def _generate(path, tok, data, **cfg):
    engine = build_hf_rollout(make_rollout_config(response_length=12, temperature=1.2, **cfg), str(path), tok)
    return engine, engine.generate(data)


def _same(a: DataProto, b: DataProto) -> None:
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    torch.testing.assert_close(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("do_sample", [True, False])
def test_fast_decode_equals_concatenating_cache_and_sdpa(setup, monkeypatch, do_sample):
    path, tok = setup
    engine, fast = _generate(path, tok, _batch(tok), do_sample=do_sample)
    assert attention.is_installed(engine.model)
    assert kv_cache.preallocated_cache(engine.model.config, 8) is not None  # the fast run used it
    assert bool((fast.batch["response_mask"].sum(-1) < 12).any())  # some rows stop early (rows are dropped)
    monkeypatch.setattr(kv_cache, "preallocated_cache", lambda config, capacity: None)
    monkeypatch.setattr(attention, "install", lambda model: False)
    monkeypatch.setattr(rollout_module, "skinny_linears", lambda model: contextlib.nullcontext())
    engine, slow = _generate(path, tok, _batch(tok), do_sample=do_sample)
    assert engine.model.config._attn_implementation == "sdpa"
    _same(fast, slow)


def test_prefill_skips_all_padding_columns_without_changing_results(setup):
    path, tok = setup
    _, tight = _generate(path, tok, _batch(tok))
    _, wide = _generate(path, tok, _batch(tok, extra_left_pad=40))
    _same(wide, tight)
    assert wide.batch["prompts"].shape[1] == tight.batch["prompts"].shape[1] + 40  # the layout keeps the width


def test_preallocated_cache_grows_in_place_and_drops_rows():
    from transformers import DynamicCache

    from verl.testing.tiny import make_tiny_model

    model = make_tiny_model(num_layers=1)
    fast = kv_cache.preallocated_cache(model.config, capacity=6)
    slow = DynamicCache(config=model.config)
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(3, 2, 4, 8, generator=g), torch.randn(3, 2, 1, 8, generator=g)]
    for cache in (fast, slow):
        for k in steps:
            keys, values = cache.update(k, -k, 0)
        assert cache.get_seq_length() == 5
    torch.testing.assert_close(fast.layers[0].keys, slow.layers[0].keys)
    keep = torch.tensor([2, 0])
    for cache in (fast, slow):
        cache.batch_select_indices(keep)
        keys, values = cache.update(steps[1][keep], -steps[1][keep], 0)
    torch.testing.assert_close(keys, slow.layers[0].keys)
    torch.testing.assert_close(values, slow.layers[0].values)
    with pytest.raises(RuntimeError, match="capacity 6 exceeded"):
        fast.update(steps[1][keep], steps[1][keep], 0)


def test_skinny_linears_compute_the_same_product_and_restore_the_modules(monkeypatch):
    from verl.testing.tiny import make_tiny_model

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    model = make_tiny_model(num_layers=1)
    lin = model.model.layers[0].mlp.up_proj
    biased = torch.nn.Linear(32, 5)
    model.add_module("extra", biased)
    few, many = torch.randn(3, 1, 32), torch.randn(decode_linears.SKINNY_ROWS + 1, 32)
    want = [lin(few), lin(many), biased(few)]
    with decode_linears.skinny_linears(model):
        assert "forward" in lin.__dict__
        got = [lin(few), lin(many), biased(few)]
    assert "forward" not in lin.__dict__ and "forward" not in biased.__dict__
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.is_contiguous()
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("capability", ["AVX512", "DEFAULT"])
def test_skinny_linears_leave_the_model_alone_where_the_form_was_not_measured_faster(monkeypatch, capability):
    """The transposed product is used on AVX2 CPUs only (slower on an AVX-512 Xeon; unmeasured elsewhere)."""
    from verl.testing.tiny import make_tiny_model

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    model = make_tiny_model(num_layers=1)
    assert not decode_linears.skinny_form_helps("cpu")
    with decode_linears.skinny_linears(model) as ctx:
        assert ctx.modules == []
        assert not any("forward" in m.__dict__ for m in model.modules())
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert decode_linears.skinny_form_helps("cpu") and not decode_linears.skinny_form_helps("meta")


def test_inverse_cdf_sample_by_hand():
    probs = torch.tensor([[0.2, 0.5, 0.3, 0.0]]).repeat(6, 1)
    u = torch.tensor([0.0, 0.19, 0.21, 0.69, 0.71, 0.99])
    # cdf = [0.2, 0.7, 1.0, 1.0]: the first token whose cumulative mass exceeds u; token 3 has no mass
    assert inverse_cdf_sample(probs, u).tolist() == [0, 0, 1, 1, 2, 2]
    # unnormalised weights: draws are scaled by each row's total
    assert inverse_cdf_sample(torch.tensor([[2.0, 0.0, 2.0]]), torch.tensor([0.6])).tolist() == [2]
    with pytest.raises(ValueError, match="uniform draws for 6 rows"):
        inverse_cdf_sample(probs, u[:2])


def test_inverse_cdf_sampling_follows_the_distribution():
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 2
    params = SamplingParams(do_sample=True, temperature=0.8, top_p=0.9, top_k=6)
    n = 40_000
    draws = torch.rand(n, generator=torch.Generator().manual_seed(1))
    tokens, logp = select_next_tokens(logits.expand(n, -1), params, draws)
    from verl.engines.reference.sampling import filter_logits

    want = torch.softmax(filter_logits(logits / 0.8, 6, 0.9), -1)[0]
    freq = torch.bincount(tokens, minlength=12).double() / n
    assert bool((freq[want == 0] == 0).all())  # filtered tokens are never drawn
    # binomial standard error is at most 0.0025 at n = 40k; allow 4 of them
    assert torch.allclose(freq, want.double(), atol=0.01)
    # log-probs are the unfiltered tempered ones (K09), whatever the sampler
    torch.testing.assert_close(logp, torch.log_softmax(logits / 0.8, -1)[0, tokens])


def _repeated(tok, n: int) -> DataProto:
    """Each prompt n times in a row (GRPO's ``repeat(n, interleave=True)``), one seed per row."""
    batch = _batch(tok, extra_left_pad=3)
    rows = torch.arange(len(PROMPTS)).repeat_interleave(n)
    seeds = torch.arange(len(rows), dtype=torch.int64) + 100
    return DataProto.from_dict(
        tensors={"input_ids": batch.batch["input_ids"][rows], "attention_mask": batch.batch["attention_mask"][rows]}
        | {"sample_seed": seeds}
    )


def test_shared_prompt_rows_maps_each_row_to_the_first_row_of_its_prompt():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 5, 6], [0, 5, 6], [0, 0, 9]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 0, 1]])
    owner, firsts = rollout_module.shared_prompt_rows(ids, mask)
    assert torch.equal(firsts[owner], torch.tensor([0, 0, 2, 0, 4]))  # rows 0, 1, 3 share row 0's prompt
    # Same tokens under a different mask (a real token 0 vs padding) are different prompts.
    assert rollout_module.shared_prompt_rows(ids[[0, 2]], mask[[0, 2]]) is None
    assert rollout_module.shared_prompt_rows(ids[[0, 4]], mask[[0, 4]]) is None


@pytest.mark.parametrize(("do_sample", "cache"), [(True, "preallocated"), (False, "preallocated"), (True, "dynamic")])
def test_shared_prompt_prefill_equals_prefilling_every_row(setup, monkeypatch, do_sample, cache):
    """n = 4 samples per prompt: one prefill per distinct prompt, keys/values copied to its rows, gives the
    same tokens and log-probs as prefilling all 24 rows (with either KV cache)."""
    path, tok = setup
    if cache == "dynamic":
        monkeypatch.setattr(kv_cache, "preallocated_cache", lambda config, capacity: None)
    calls = []
    config = make_rollout_config(response_length=12, temperature=1.2, do_sample=do_sample)
    engine = build_hf_rollout(config, str(path), tok)
    forward = engine.model.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.model, "forward", counting)
    shared = engine.generate(_repeated(tok, 4))
    assert calls[0][0] == len(PROMPTS)  # the prefill ran on the 6 distinct prompts, not 24 rows
    monkeypatch.setattr(rollout_module, "SHARE_PROMPT_PREFILL", False)
    calls.clear()
    every = engine.generate(_repeated(tok, 4))
    assert calls[0][0] == 4 * len(PROMPTS)
    _same(shared, every)
    if do_sample:  # the n samples of a prompt differ (their own seeds), so the copies are independent rows
        r = shared.batch["responses"].view(len(PROMPTS), 4, -1)
        assert any(not torch.equal(r[p, 0], r[p, k]) for p in range(len(PROMPTS)) for k in range(1, 4))
