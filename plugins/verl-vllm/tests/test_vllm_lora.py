"""LoRA served as an adapter by the vLLM engine (``model.lora.merge`` unset/false), against merged weights.

A reference training engine with peft LoRA (r = 8, alpha = 16, ``all-linear``) on the suite's tiny Llama gives the
adapter; its B is set to seeded random values so the adapter changes the output. The expectation comes from core's
``hf`` engine loaded with the merged weights ``W + (alpha / r) B @ A`` (:func:`verl.engines.lora.merged_weights`),
never from the engine under test alone. Runs in the ``plugin(vllm)`` nox session.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
import torch

from verl.testing.conformance import make_prompt_batch, make_rollout_config, save_conformance_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")
TEXTS = ("What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with some words")
OPTIONS = {"max_model_len": 256, "max_num_batched_tokens": 256}
RANK = 8


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("vllm_lora") / "model", hidden_size=128)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from verl.models import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def config():
    return make_rollout_config(n=1, dtype="float32")


@pytest.fixture(scope="module")
def engine(model_path, tokenizer, config):
    from verl_vllm.engine import VLLMRolloutEngine
    from verl_vllm.options import VLLMRolloutOptions

    eng = VLLMRolloutEngine(
        model_path, tokenizer, config, device=DEVICE, options=VLLMRolloutOptions(**OPTIONS), lora_rank=RANK
    )
    yield eng
    eng.close()


def _actor(model_path, seed):
    """A LoRA actor whose B matrices are seeded noise (peft starts them at 0, which would test nothing)."""
    from verl.engines.lora import LoraSettings
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

    settings = EngineSettings(dtype="float32", lora=LoraSettings(rank=RANK, alpha=16))
    optim = SimpleNamespace(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    actor = ReferenceTrainingEngine(model_path, settings, optim=optim, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in actor.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return actor


def _meta(batch, **meta):
    from verl.protocol import DataProto

    return DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()}, meta_info=meta)


def _merged_hf(model_path, tokenizer, config, actor):
    from verl.engines.reference.rollout import HFRolloutEngine

    hf = HFRolloutEngine(model_path, tokenizer, config, device="cpu")
    hf.update_weights(actor.iter_weights())  # merged: W + (alpha / r) * B @ A under the base names
    return hf


def test_adapter_serving_equals_merged_weights(engine, model_path, tokenizer, config):
    """Greedy tokens equal and log-probs within 1e-4 of the hf engine on the merged weights, for two adapters
    loaded one after the other into the same slot (the in-place reload and the prefix-cache reset work)."""
    assert engine.serves_lora_adapters and engine.lora_request is None
    prompts = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)
    base = engine.generate(prompts)  # before any adapter: the base model (what a fresh B = 0 adapter computes)
    for seed in (1, 2):
        actor = _actor(model_path, seed)
        tensors, lora_config = actor.lora_adapter()
        assert lora_config["r"] == RANK and lora_config["lora_alpha"] == 16
        assert all(".lora_A." in k or ".lora_B." in k for k in tensors)
        engine.load_lora_adapter(tensors, lora_config)
        out = engine.generate(prompts)
        expected = _merged_hf(model_path, tokenizer, config, actor).generate(prompts)
        assert torch.equal(out.batch["responses"], expected.batch["responses"]), seed
        diff = (out.batch["rollout_log_probs"] - expected.batch["rollout_log_probs"]).abs().max()
        assert float(diff) < 1e-4, (seed, float(diff))
        assert not torch.equal(out.batch["rollout_log_probs"], base.batch["rollout_log_probs"])
    assert engine.lora_request.lora_int_id == 1 and not engine.lora_request.load_inplace


def test_colocated_sync_sends_only_the_adapter(engine, model_path, tokenizer, config):
    """The hybrid sync (core's colocated checkpoint engine) hands over the adapter alone: its tensors and bytes
    are the adapter's, and generation afterwards equals the merged weights'."""
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine

    actor = _actor(model_path, 3)
    metrics = ColocatedCheckpointEngine().sync(actor, engine)
    adapter = [p for n, p in actor.model.named_parameters() if p.requires_grad]
    assert metrics["adapter"] is True and metrics["tensors"] == len(adapter)
    assert metrics["bytes"] == sum(p.numel() * p.element_size() for p in adapter)
    prompts = _meta(make_prompt_batch(tokenizer, TEXTS), validate=True)
    expected = _merged_hf(model_path, tokenizer, config, actor).generate(prompts)
    assert torch.equal(engine.generate(prompts).batch["responses"], expected.batch["responses"])


def test_async_server_requests_carry_the_adapter(engine, model_path, tokenizer, config):
    """``rollout.mode=async``: requests admitted by the engine's server generate with the served adapter, greedy
    tokens and log-probs as the ``hf`` engine on the merged weights."""
    import asyncio

    actor = _actor(model_path, 5)
    engine.load_lora_adapter(*actor.lora_adapter())
    batch = make_prompt_batch(tokenizer, TEXTS)
    prompts = [
        row[mask.bool()].tolist()
        for row, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"], strict=True)
    ]
    expected = _merged_hf(model_path, tokenizer, config, actor).generate(
        _meta(batch, validate=True, response_length=32)
    )
    server = engine.server()

    async def run():
        params = {"temperature": 0.0, "logprobs": True, "max_tokens": 32}
        return await asyncio.gather(*(server.generate(f"lora{i}", p, params) for i, p in enumerate(prompts)))

    outs = asyncio.run(run())
    for i, out in enumerate(outs):
        n = int(expected.batch["response_mask"][i].sum())
        assert out.token_ids == expected.batch["responses"][i, :n].tolist(), i
        want = expected.batch["rollout_log_probs"][i, :n].tolist()
        assert max(abs(a - b) for a, b in zip(out.log_probs, want, strict=True)) < 1e-4, i


def test_adapter_on_lm_head_is_refused_and_keeps_the_served_one(engine, model_path):
    actor = _actor(model_path, 4)
    tensors, lora_config = actor.lora_adapter()
    before = engine.lora_request
    bad = dict(tensors)
    bad["base_model.model.lm_head.lora_A.weight"] = torch.zeros(RANK, 128)
    with pytest.raises(ValueError, match="lm_head"):
        engine.load_lora_adapter(bad, lora_config)
    with pytest.raises(ValueError, match="max_lora_rank=8"):
        engine.load_lora_adapter(tensors, {**lora_config, "r": 16})
    assert engine.lora_request == before


def test_engine_without_lora_refuses_an_adapter(model_path, tokenizer, config):
    from verl_vllm.engine import VLLMRolloutEngine
    from verl_vllm.options import VLLMRolloutOptions

    eng = VLLMRolloutEngine(model_path, tokenizer, config, device=DEVICE, options=VLLMRolloutOptions(**OPTIONS))
    try:
        assert not eng.serves_lora_adapters and eng.lora_request is None
        with pytest.raises(RuntimeError, match="lora_rank=0"):
            eng.load_lora_adapter({}, {"r": 8})
    finally:
        eng.close()
