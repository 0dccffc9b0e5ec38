"""HFRolloutEngine on the tiny model: layout invariants, EOS stop, determinism, log-probs, padding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl.engines.base import RolloutEngine
from verl.engines.reference.rollout import HFRolloutEngine, build_hf_rollout
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.tiny import save_tiny_model

RESP = 12
PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with words"]


def make_cfg(**kw):
    base = dict(
        response_length=RESP,
        calculate_log_probs=True,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        do_sample=True,
        seed=0,
        val_kwargs=SimpleNamespace(do_sample=False, temperature=0.0, top_p=1.0, top_k=-1, n=1),
    )
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tok):
    """Position-sensitive toy model (learned absolute positions, K07): RoPE models such as the tiny Llama
    are invariant to a constant position shift, so they cannot expose a wrong position-id rule."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.2,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    folder = tmp_path_factory.mktemp("gpt2") / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def any_model_dir(request, model_dir, gpt2_dir):
    return model_dir if request.param == "llama" else gpt2_dir


@pytest.fixture(scope="module")
def engine(model_dir, tok):
    return build_hf_rollout(make_cfg(), model_dir, tok)


def encode(tok, texts, meta=None):
    enc = tok(texts, padding=True, return_tensors="pt")
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, meta_info=meta or {}
    )


def reference_log_probs(model, out, temperature):
    """Plain forward pass over [prompt | response]: log_softmax(logits / T) at the response tokens."""
    ids, mask = out.batch["input_ids"], out.batch["attention_mask"]
    pos = torch.clip(torch.cumsum(mask, -1) - 1, min=0)
    p = out.batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    logp = torch.log_softmax(logits[:, p - 1 : -1] / temperature, dim=-1)
    return logp.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1) * out.batch["response_mask"]


def test_conforms_to_rollout_engine_protocol(engine):
    assert isinstance(engine, RolloutEngine)


def test_output_layout_and_invariants(engine, tok):
    prompts = encode(tok, PROMPTS)
    out = engine.generate(prompts)
    b = out.batch
    bs, p = prompts.batch["input_ids"].shape
    assert len(out) == bs
    shapes = {k: tuple(b[k].shape) for k in b.keys()}
    assert shapes == {
        "prompts": (bs, p),
        "responses": (bs, RESP),
        "response_mask": (bs, RESP),
        "input_ids": (bs, p + RESP),
        "attention_mask": (bs, p + RESP),
        "position_ids": (bs, p + RESP),
        "rollout_log_probs": (bs, RESP),
    }
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert b[k].dtype == torch.int64, k
    assert b["rollout_log_probs"].dtype == torch.float32
    assert torch.equal(b["prompts"], prompts.batch["input_ids"])
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert torch.equal(b["attention_mask"], torch.cat([prompts.batch["attention_mask"], b["response_mask"]], 1))
    expected_pos = [[max(sum(row[: j + 1]) - 1, 0) for j in range(len(row))] for row in b["attention_mask"].tolist()]
    assert b["position_ids"].tolist() == expected_pos
    mask = b["response_mask"]
    assert torch.all(mask[:, 1:] <= mask[:, :-1])  # valid tokens form a prefix
    assert torch.all(b["responses"][mask == 0] == tok.pad_token_id)
    assert torch.all(b["rollout_log_probs"][mask == 0] == 0)
    assert torch.all(b["rollout_log_probs"][mask == 1] < 0)
    assert out.meta_info["timing"]["generate_sequences"] > 0


def test_rollout_log_probs_match_plain_forward_sampled(any_model_dir, tok):
    eng = HFRolloutEngine(any_model_dir, tok, make_cfg(temperature=0.7, top_k=20, top_p=0.9))
    out = eng.generate(encode(tok, PROMPTS))
    ref = reference_log_probs(eng.model, out, temperature=0.7)
    torch.testing.assert_close(out.batch["rollout_log_probs"], ref, atol=1e-5, rtol=0)


def test_rollout_log_probs_match_plain_forward_greedy(any_model_dir, tok):
    engine = HFRolloutEngine(any_model_dir, tok, make_cfg())
    out = engine.generate(encode(tok, PROMPTS, {"validate": True}))
    ref = reference_log_probs(engine.model, out, temperature=1.0)  # greedy: untempered (K09)
    torch.testing.assert_close(out.batch["rollout_log_probs"], ref, atol=1e-5, rtol=0)
    greedy = torch.argmax(
        engine.model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits[:, out.batch["prompts"].shape[1] - 1 : -1],
        -1,
    )
    mask = out.batch["response_mask"].bool()
    assert torch.equal(greedy[mask], out.batch["responses"][mask])


def test_greedy_is_deterministic_and_validate_uses_val_kwargs(model_dir, tok, engine):
    a = engine.generate(encode(tok, PROMPTS, {"validate": True}))
    b = engine.generate(encode(tok, PROMPTS, {"validate": True}))
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    no_sample = HFRolloutEngine(model_dir, tok, make_cfg(do_sample=False, temperature=0.3))
    c = no_sample.generate(encode(tok, PROMPTS))
    assert torch.equal(a.batch["responses"], c.batch["responses"])


def test_seeded_sampling_is_reproducible(model_dir, tok):
    runs = [HFRolloutEngine(model_dir, tok, make_cfg(seed=s)) for s in (7, 7, 8)]
    outs = [e.generate(encode(tok, PROMPTS)).batch["responses"] for e in runs]
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    again = runs[0].generate(encode(tok, PROMPTS)).batch["responses"]
    assert not torch.equal(outs[0], again)  # the generator advances between calls


def test_stops_at_any_eos_id_and_pads_after(model_dir, tok):
    eng = HFRolloutEngine(model_dir, tok, make_cfg(do_sample=False))
    free = eng.generate(encode(tok, PROMPTS)).batch["responses"]
    assert eng.eos_token_ids == [tok.eos_token_id]
    # Declare two tokens the greedy run produces as EOS ids (K06c: the pad id is one of them).
    stop_a, stop_b = int(free[0, 3]), int(free[1, 5])
    eng.eos_token_ids = [stop_a, stop_b]
    eng.pad_token_id = stop_b
    out = eng.generate(encode(tok, PROMPTS)).batch
    for row in range(len(PROMPTS)):
        seq = free[row].tolist()
        hits = [t for t, x in enumerate(seq) if x in (stop_a, stop_b)]
        n = hits[0] + 1 if hits else RESP
        assert out["response_mask"][row].tolist() == [1] * n + [0] * (RESP - n)
        assert out["responses"][row, :n].tolist() == seq[:n]
        assert out["responses"][row, n:].tolist() == [stop_b] * (RESP - n)
    assert int(out["response_mask"][0].sum()) <= 4


def test_generation_config_eos_ids_are_added(tmp_path, tok):
    from transformers import GenerationConfig

    folder = save_tiny_model(tmp_path / "m")
    GenerationConfig(eos_token_id=[2, 7], pad_token_id=3).save_pretrained(folder)
    eng = HFRolloutEngine(folder, tok, make_cfg())
    assert eng.eos_token_ids == [2, 7]


def test_left_padding_invariance(any_model_dir, tok):
    engine = HFRolloutEngine(any_model_dir, tok, make_cfg())
    ids = tok("What is 12 * 3?")["input_ids"]
    pad = tok.pad_token_id
    plain = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)},
        meta_info={"validate": True},
    )
    padded = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([[pad] * 3 + ids]),
            "attention_mask": torch.tensor([[0] * 3 + [1] * len(ids)]),
        },
        meta_info={"validate": True},
    )
    a, b = engine.generate(plain).batch, engine.generate(padded).batch
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5, rtol=0)
    assert torch.equal(a["position_ids"][:, -RESP:], b["position_ids"][:, -RESP:])


def test_chunking_by_max_num_seqs_gives_same_greedy_output(model_dir, tok, engine):
    chunked = HFRolloutEngine(model_dir, tok, make_cfg(max_num_seqs=3))
    a = engine.generate(encode(tok, PROMPTS, {"validate": True})).batch
    b = chunked.generate(encode(tok, PROMPTS, {"validate": True})).batch
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5, rtol=0)


def test_no_log_probs_unless_configured(model_dir, tok):
    eng = HFRolloutEngine(model_dir, tok, make_cfg(calculate_log_probs=False))
    assert "rollout_log_probs" not in eng.generate(encode(tok, PROMPTS[:1])).batch.keys()


def test_live_module_is_used_as_is_and_train_flag_restored(tok):
    from verl.testing.tiny import make_tiny_model

    model = make_tiny_model().train()
    eng = HFRolloutEngine(model, tok, make_cfg(dtype="bfloat16"))
    assert eng.model is model
    eng.generate(encode(tok, PROMPTS[:2]))
    assert model.training and next(model.parameters()).dtype == torch.float32
    eng.sleep()
    eng.wake_up()  # no-ops on CPU / for a borrowed module
    assert next(model.parameters()).device.type == "cpu"
    with pytest.raises(TypeError, match="tokenizer"):
        HFRolloutEngine(model, None, make_cfg())


def test_bad_prompts_are_rejected(engine, tok):
    enc = tok(PROMPTS[:2], padding=True, padding_side="right", return_tensors="pt")
    right = DataProto.from_dict(tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    with pytest.raises(ValueError, match="left-padded"):
        engine.generate(right)
    empty = DataProto.from_dict(tensors={"input_ids": torch.tensor([[3, 3]]), "attention_mask": torch.tensor([[0, 0]])})
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate(empty)
    with pytest.raises(KeyError, match="attention_mask"):
        engine.generate(DataProto.from_dict(tensors={"input_ids": torch.tensor([[5, 6]])}))
    too_long = encode(tok, PROMPTS[:1], {"response_length": 5000})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate(too_long)


def test_empty_batch_gives_empty_output(engine):
    empty = DataProto.from_dict(
        tensors={
            "input_ids": torch.zeros(0, 5, dtype=torch.long),
            "attention_mask": torch.zeros(0, 5, dtype=torch.long),
        }
    )
    out = engine.generate(empty).batch
    assert tuple(out["responses"].shape) == (0, RESP) and tuple(out["input_ids"].shape) == (0, 5 + RESP)


def test_per_call_seed_in_meta_info_reseeds_the_sampler(model_dir, tok):
    a = HFRolloutEngine(model_dir, tok, make_cfg(seed=1))
    b = HFRolloutEngine(model_dir, tok, make_cfg(seed=2))
    b.generate(encode(tok, PROMPTS))  # b's generator has advanced; the per-call seed must override that
    ra = a.generate(encode(tok, PROMPTS, {"seed": 123})).batch["responses"]
    rb = b.generate(encode(tok, PROMPTS, {"seed": 123})).batch["responses"]
    assert torch.equal(ra, rb)
