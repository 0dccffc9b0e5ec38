"""HFRolloutEngine.update_weights and ColocatedCheckpointEngine (weight sync without disk)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl.engines.base import CheckpointEngine
from verl.engines.reference.rollout import HFRolloutEngine, UnknownWeightError
from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine, shares_module
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.testing.tiny import make_tiny_model, save_tiny_model

PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64)


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture
def engine(model_dir, tok):
    return HFRolloutEngine(model_dir, tok, SimpleNamespace(response_length=10, calculate_log_probs=True))


def greedy(engine, tok):
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    data = DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, meta_info={"validate": True}
    )
    return engine.generate(data).batch


class FakeTrainer:
    """Minimal trainer side of the sync: iter_weights over a module's state_dict (HF names)."""

    def __init__(self, model):
        self.model = model

    def iter_weights(self):
        yield from self.model.state_dict().items()


def test_update_weights_changes_outputs_and_restore_is_exact(engine, tok):
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    before = greedy(engine, tok)
    other = make_tiny_model(len(tok), hidden_size=64, seed=1)
    engine.update_weights(iter(other.state_dict().items()))
    changed = greedy(engine, tok)
    assert not torch.equal(changed["responses"], before["responses"])
    engine.update_weights(iter(original.items()))
    after = greedy(engine, tok)
    assert torch.equal(after["responses"], before["responses"])
    assert torch.equal(after["rollout_log_probs"], before["rollout_log_probs"])


def test_tied_embedding_updated_through_either_name(engine):
    new = torch.randn_like(engine.model.model.embed_tokens.weight)
    engine.update_weights(iter([("model.embed_tokens.weight", new)]))
    assert torch.equal(engine.model.lm_head.weight, new)
    newer = torch.randn_like(new)
    engine.update_weights(iter([("lm_head.weight", newer.double())]))  # dtype converted on copy
    assert torch.equal(engine.model.model.embed_tokens.weight, newer)


def test_unknown_name_and_shape_mismatch_are_errors(engine):
    with pytest.raises(UnknownWeightError, match="model.layers.0.self_attn.q_proj.weightt") as err:
        engine.update_weights(iter([("model.layers.0.self_attn.q_proj.weightt", torch.zeros(1))]))
    assert isinstance(err.value, KeyError)
    assert "did you mean" in str(err.value)
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(3,\).*\(64,\)"):
        engine.update_weights(iter([("model.norm.weight", torch.zeros(3))]))


def test_colocated_sync_copies_trainer_weights(engine, tok):
    sync = ColocatedCheckpointEngine()
    assert isinstance(sync, CheckpointEngine)
    trained = make_tiny_model(len(tok), hidden_size=64, seed=2)
    metrics = sync.sync(FakeTrainer(trained), engine)
    sd = trained.state_dict()
    assert metrics["tensors"] == len(sd)
    assert metrics["bytes"] == sum(t.numel() * 4 for t in sd.values())  # float32
    assert metrics["shared"] is False and metrics["seconds"] >= 0
    for name, tensor in sd.items():
        assert torch.equal(engine.model.state_dict()[name], tensor), name
    assert engine.model is not trained  # a copy: later trainer steps need another sync
    with torch.no_grad():
        trained.model.norm.weight.add_(1.0)
    assert not torch.equal(engine.model.model.norm.weight, trained.model.norm.weight)


def test_shared_module_sync_is_a_noop(tok):
    model = make_tiny_model(len(tok))
    rollout = HFRolloutEngine(model, tok, SimpleNamespace(response_length=4))
    trainer = FakeTrainer(model)
    assert shares_module(trainer, rollout)
    trainer.iter_weights = lambda: pytest.fail("a shared module must not be re-sent")
    metrics = ColocatedCheckpointEngine().sync(trainer, rollout)
    assert metrics["shared"] is True and metrics["tensors"] == 0 and metrics["bytes"] == 0
    with torch.no_grad():  # an optimizer step on the trainer is visible to the rollout at once
        model.model.norm.weight.mul_(2.0)
    assert rollout.model.model.norm.weight is model.model.norm.weight


def test_update_weights_skips_tensors_that_alias_the_live_parameters(tok):
    model = make_tiny_model(len(tok))
    rollout = HFRolloutEngine(model, tok, SimpleNamespace(response_length=4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rollout.update_weights(iter(model.state_dict().items()))  # every tensor aliases its own parameter
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
