"""``actor_rollout_ref.model.{override_config, trust_remote_code}`` reach the model vLLM loads.

The override is read back from vLLM's own model config, and the running engine's greedy answers are compared
with core's ``hf`` engine loading the same override (its load is checked against a hand-built model in
``core/tests/engines/test_hf_rollout_model_config.py``).
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
import torch
from verl_vllm.model_config import hf_overrides, load_model_config

from verl.config import ModelConfig
from verl.testing.conformance import make_prompt_batch, make_rollout_config, save_conformance_model

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")
TEXTS = ("What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with some words")
OVERRIDE = {"rms_norm_eps": 0.25}

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_conformance_model(tmp_path_factory.mktemp("vllm_model_config") / "model", hidden_size=128)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from verl.models import load_tokenizer

    return load_tokenizer(model_path)


def _rollout(**kw):
    return make_rollout_config(n=1, dtype="float32", **kw)


def _options():
    """The validated ``engine_kwargs.vllm`` the factory gets (built here directly: the root is a stand-in)."""
    from verl_vllm.options import VLLMRolloutOptions

    return VLLMRolloutOptions(max_model_len=256, max_num_batched_tokens=256)


def _root(rollout, model: ModelConfig) -> SimpleNamespace:
    return SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout, model=model))


def test_hf_overrides_is_the_attribute_part_of_override_config():
    model = ModelConfig(
        override_config={
            "attn_implementation": "eager",
            "model_config": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rms_norm_eps": 0.5},
        }
    )
    out = hf_overrides(model)
    assert out == {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rms_norm_eps": 0.5}
    assert type(out["rope_scaling"]) is dict  # vLLM tests isinstance(value, dict) to update sub-configs
    assert hf_overrides(ModelConfig()) == {} and hf_overrides(None) == {}


def test_unknown_override_key_is_refused_before_vllm_starts(model_path):
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.override_config\.rms_eps.*rms_norm_eps"):
        load_model_config(model_path, ModelConfig(override_config={"rms_eps": 0.1}))
    assert load_model_config(model_path, ModelConfig(override_config=OVERRIDE)).rms_norm_eps == 0.25


@needs_vllm
def test_overridden_context_length_bounds_the_rollout(model_path, tokenizer):
    from verl_vllm.engine import ModelTooLongError, VLLMRolloutEngine

    # prompt_length 32 + response_length 16 = 48 tokens do not fit an overridden 40-position model.
    rollout = make_rollout_config(n=1, dtype="float32", engine_kwargs={})
    small = ModelConfig(override_config={"max_position_embeddings": 40})
    with pytest.raises(ModelTooLongError, match="40"):
        VLLMRolloutEngine(model_path, tokenizer, rollout, device=DEVICE, model_config=small)


@needs_vllm
def test_vllm_runs_the_overridden_model(model_path, tokenizer):
    from verl_vllm.builder import build_vllm_rollout_engine

    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.protocol import DataProto

    model = ModelConfig(path=str(model_path), override_config=OVERRIDE, trust_remote_code=True)
    rollout = _rollout()
    engine = build_vllm_rollout_engine(
        _root(rollout, model), model=model_path, tokenizer=tokenizer, options=_options(), device=DEVICE
    )
    try:
        vllm_model = engine.llm.llm_engine.vllm_config.model_config
        assert vllm_model.hf_config.rms_norm_eps == 0.25
        assert vllm_model.trust_remote_code is True
        assert engine.hf_config.rms_norm_eps == 0.25

        def greedy(eng):
            batch = make_prompt_batch(tokenizer, TEXTS)
            tensors = {k: batch.batch[k] for k in batch.batch.keys()}
            return eng.generate(DataProto.from_dict(tensors=tensors, meta_info={"validate": True}))

        out = greedy(engine)
        same = greedy(HFRolloutEngine(model_path, tokenizer, rollout, device="cpu", model_config=model))
        saved = greedy(HFRolloutEngine(model_path, tokenizer, rollout, device="cpu"))
    finally:
        engine.close()
    assert torch.equal(out.batch["responses"], same.batch["responses"])
    diff = (out.batch["rollout_log_probs"] - same.batch["rollout_log_probs"]).abs().max()
    assert float(diff) < 1e-4
    # Without the override the model answers differently, so the comparison above can fail.
    changed = (saved.batch["rollout_log_probs"] - same.batch["rollout_log_probs"]).abs().max()
    assert float(changed) > 1e-3
