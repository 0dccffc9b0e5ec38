"""vLLM-engine behaviour beyond the conformance suite: seeds, cross-engine agreement, weight updates, errors.

One engine on the suite's tiny Llama (hidden 128, float32) serves the module; expectations come from core's
``hf`` engine (greedy text) and from the reference training engine, never from the engine under test alone.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from verl.testing.conformance import make_prompt_batch, make_rollout_config, perturb_weights, save_conformance_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")
TEXTS = ("What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with some words")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("vllm_engine") / "model", hidden_size=128)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from verl.models import load_tokenizer

    return load_tokenizer(model_path)


#: The engine's validated engine_kwargs.vllm (what config load hands the factory); built here directly.
OPTIONS = {"max_model_len": 256, "max_num_batched_tokens": 256}


@pytest.fixture(scope="module")
def config():
    return make_rollout_config(n=1, dtype="float32")


@pytest.fixture(scope="module")
def engine(model_path, tokenizer, config):
    from verl_vllm.engine import VLLMRolloutEngine
    from verl_vllm.options import VLLMRolloutOptions

    eng = VLLMRolloutEngine(model_path, tokenizer, config, device=DEVICE, options=VLLMRolloutOptions(**OPTIONS))
    yield eng
    eng.close()


def _meta(batch, **meta):
    from verl.protocol import DataProto

    return DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()}, meta_info=meta)


def test_startup_is_recorded(engine):
    assert 0 < engine.startup_seconds < 300


def test_greedy_text_equals_hf_engine(engine, model_path, tokenizer, config):
    from verl.engines.reference.rollout import HFRolloutEngine

    prompts = make_prompt_batch(tokenizer, TEXTS)
    hf = HFRolloutEngine(model_path, tokenizer, config, device="cpu").generate(_meta(prompts, validate=True))
    out = engine.generate(_meta(prompts, validate=True))
    assert torch.equal(out.batch["responses"], hf.batch["responses"])
    assert torch.equal(out.batch["response_mask"], hf.batch["response_mask"])
    diff = (out.batch["rollout_log_probs"] - hf.batch["rollout_log_probs"]).abs().max()
    assert float(diff) < 1e-4


def test_sample_seed_makes_rows_independent_of_their_batch(engine, tokenizer):
    prompts = make_prompt_batch(tokenizer, TEXTS, n=2)
    seeds = torch.arange(100, 100 + len(prompts), dtype=torch.long)
    prompts.batch["sample_seed"] = seeds
    full = engine.generate(_meta(prompts))
    rows = torch.tensor([5, 2])
    part = prompts[rows]
    part.batch["sample_seed"] = seeds[rows]
    sub = engine.generate(_meta(part))
    assert torch.equal(sub.batch["responses"], full.batch["responses"][rows])
    # Same prompt, different seeds (rows 0 and 1 repeat prompt 0): the two samples are drawn independently.
    again = engine.generate(_meta(prompts))
    assert torch.equal(again.batch["responses"], full.batch["responses"])


def test_seeded_batch_larger_than_one_scheduler_step(engine, tokenizer):
    """More prompt tokens than one scheduler step takes (max_num_batched_tokens = max_model_len = 256 here),
    every row seeded as the trainer does: prefill spans several steps (vLLM 0.32 on CPU crashed on
    chunked prefills of seeded requests), and each row still samples what it samples alone."""
    texts = [f"Question {i}: what is {i} plus {2 * i}? Answer briefly." for i in range(24)]
    prompts = make_prompt_batch(tokenizer, texts)
    assert int(prompts.batch["attention_mask"].sum()) > 256
    prompts.batch["sample_seed"] = torch.arange(len(prompts), dtype=torch.long) * 7 + 1
    full = engine.generate(_meta(prompts))
    rows = torch.tensor([3, 17])
    part = prompts[rows]
    part.batch["sample_seed"] = prompts.batch["sample_seed"][rows]
    assert torch.equal(engine.generate(_meta(part)).batch["responses"], full.batch["responses"][rows])


def test_call_seed_reproduces_a_call(engine, tokenizer):
    prompts = make_prompt_batch(tokenizer, TEXTS, n=2)
    first = engine.generate(_meta(prompts, seed=3))
    second = engine.generate(_meta(prompts, seed=3))
    other = engine.generate(_meta(prompts, seed=4))
    assert torch.equal(first.batch["responses"], second.batch["responses"])
    assert not torch.equal(first.batch["responses"], other.batch["responses"])


def test_update_weights_reaches_cached_prefixes(engine, model_path, tokenizer, config):
    """After an update, even prompts whose KV blocks are cached (prefix caching) use the new weights."""
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

    reference = ReferenceTrainingEngine(model_path, EngineSettings(dtype="float32"), device="cpu")
    original = perturb_weights(reference.iter_weights(), scale=0.0)
    perturbed = perturb_weights(reference.iter_weights(), scale=0.5, seed=1)
    prompts = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)
    engine.generate(prompts)  # fills the prefix cache with the original weights' KV blocks
    try:
        engine.update_weights(iter(perturbed.items()))
        out = engine.generate(prompts)
    finally:
        engine.update_weights(iter(original.items()))
    hf = HFRolloutEngine(model_path, tokenizer, config, device="cpu")
    hf.update_weights(iter(perturbed.items()))
    expected = hf.generate(prompts)
    assert torch.equal(out.batch["responses"], expected.batch["responses"])


def test_partial_update_keeps_other_weights(engine, model_path, tokenizer, config):
    """Sending a few tensors (a whole q/k/v group and the final norm) changes only those."""
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

    reference = ReferenceTrainingEngine(model_path, EngineSettings(dtype="float32"), device="cpu")
    original = perturb_weights(reference.iter_weights(), scale=0.0)
    perturbed = perturb_weights(reference.iter_weights(), scale=1.0, seed=2)
    names = [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv"] + ["model.norm.weight"]
    part = {name: perturbed[name] * (1.5 if name == "model.norm.weight" else 1.0) for name in names}
    prompts = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)
    before = engine.generate(prompts)
    try:
        engine.update_weights(iter(part.items()))
        out = engine.generate(prompts)
    finally:
        engine.update_weights(iter(original.items()))
    hf = HFRolloutEngine(model_path, tokenizer, config, device="cpu")
    hf.update_weights(iter(part.items()))
    assert torch.equal(out.batch["responses"], hf.generate(prompts).batch["responses"])
    assert not torch.equal(out.batch["responses"], before.batch["responses"])


@pytest.mark.parametrize(
    ("pairs", "error", "fragment"),
    [
        ([("model.layers.0.self_attn.q_prj.weight", (128, 128))], KeyError, "did you mean"),
        ([("model.norm.weight", (64,))], ValueError, "has shape (64,), the rollout model expects (128,)"),
        ([("model.layers.0.mlp.up_proj.weight", (256, 128))], ValueError, "without ['model.layers.0.mlp.gate_proj"),
    ],
)
def test_bad_update_raises_and_loads_nothing(engine, tokenizer, pairs, error, fragment):
    prompts = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)
    before = engine.generate(prompts)
    with pytest.raises(error) as info:
        engine.update_weights(iter([(name, torch.zeros(shape)) for name, shape in pairs]))
    assert fragment in str(info.value)
    assert torch.equal(engine.generate(prompts).batch["responses"], before.batch["responses"])


@pytest.mark.skipif(DEVICE != "cpu", reason="sleep is a no-op only on cpu")
def test_sleep_is_a_no_op_on_cpu(engine, tokenizer):
    prompts = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)
    before = engine.generate(prompts)
    engine.sleep()
    assert engine._asleep is False
    engine.wake_up()
    assert torch.equal(engine.generate(prompts).batch["responses"], before.batch["responses"])


def test_prompt_plus_response_longer_than_max_model_len(model_path, tokenizer):
    from verl_vllm.engine import ModelTooLongError, VLLMRolloutEngine
    from verl_vllm.options import VLLMRolloutOptions

    config = make_rollout_config(prompt_length=200, response_length=100)
    with pytest.raises(ModelTooLongError, match=r"\(200\) \+ rollout.response_length \(100\) = 300 tokens exceeds"):
        VLLMRolloutEngine(model_path, tokenizer, config, device=DEVICE, options=VLLMRolloutOptions(max_model_len=256))
