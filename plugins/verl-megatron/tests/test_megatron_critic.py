"""The megatron critic (``critic.strategy=megatron``) on a 1-rank group: the reference critic's values, one update,
and the value-model export; a causal-LM checkpoint gets HF's head initialisation."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.config import load_config, role_options
from verl.engines.reference.builders import build_reference_training_engine
from verl.plugins import get_plugin_manager
from verl.testing.conformance.inputs import make_training_batch
from verl.testing.tiny import save_tiny_model
from verl.workers.losses import make_value_loss

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


@pytest.fixture(scope="module")
def value_model(tmp_path_factory):
    """A tiny value-model folder (``LlamaForTokenClassification``, one label): both critics load the same head."""
    from transformers import AutoModelForTokenClassification

    causal = save_tiny_model(tmp_path_factory.mktemp("causal") / "tiny")
    folder = tmp_path_factory.mktemp("value") / "tiny-value"
    torch.manual_seed(3)
    model = AutoModelForTokenClassification.from_pretrained(str(causal), num_labels=1)
    with torch.no_grad():
        model.score.bias.fill_(0.25)  # a bias that is not HF's 0 shows it is loaded
    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (causal / name).exists():
            (folder / name).write_bytes((causal / name).read_bytes())
    return folder, causal


def _cfg(path, strategy):
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={path}",
            f"critic.strategy={strategy}",
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.rollout.n=1",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "critic.ppo_mini_batch_size=8",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.optim.lr=0.01",
        ]
    )


def _build(path, strategy):
    cfg = _cfg(path, strategy)
    spec = get_plugin_manager().get("training_engine", strategy)
    return spec.factory(
        cfg, role="critic", model=str(path), options=role_options(cfg, "critic", spec), total_training_steps=4
    )


def test_megatron_critic_matches_the_reference_critic(value_model):
    from verl_megatron.engine import MegatronCriticEngine

    folder, _ = value_model
    megatron = _build(folder, "megatron")
    assert isinstance(megatron, MegatronCriticEngine)
    reference = build_reference_training_engine(
        _cfg(folder, "reference"), role="critic", model=str(folder), options=None, total_training_steps=4
    )
    data = make_training_batch()
    got = megatron.compute_values(data).batch["values"]
    want = reference.compute_values(data).batch["values"]
    assert float(want.abs().max()) > 0.1  # the loaded bias (0.25) shows through
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    data.batch["values"] = want
    data.batch["returns"] = torch.linspace(-1, 1, want.numel()).view_as(want) * data.batch["response_mask"]
    loss = make_value_loss(_cfg(folder, "reference").critic)
    for _ in range(2):
        m_got = megatron.train_batch(copy.deepcopy(data), loss)
        m_want = reference.train_batch(copy.deepcopy(data), loss)
        for key in ("critic/vf_loss", "critic/grad_norm", "critic/lr"):
            assert m_got[key][0] == pytest.approx(m_want[key][0], rel=1e-4, abs=1e-7), (key, m_got[key], m_want[key])
    after_got = megatron.compute_values(data).batch["values"]
    after_want = reference.compute_values(data).batch["values"]
    assert float((after_want - want).abs().max()) > 1e-3  # the updates moved the values
    torch.testing.assert_close(after_got, after_want, atol=1e-4, rtol=0)
    names = {n for n, _ in megatron.iter_weights()}
    assert {"score.weight", "score.bias"} <= names and "lm_head.weight" not in names


def test_megatron_critic_export_is_a_value_model(value_model, tmp_path):
    from transformers import AutoModelForTokenClassification

    folder, _ = value_model
    engine = _build(folder, "megatron")
    engine.save_hf(tmp_path / "out")
    loaded = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "out"), num_labels=1)
    want = dict(engine.iter_weights())
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, want[name], atol=0, rtol=0, msg=name)
    assert float(loaded.score.bias) == pytest.approx(0.25)


def test_causal_lm_checkpoint_gets_hf_style_head_init(value_model):
    _, causal = value_model
    engine = _build(causal, "megatron")
    weights = dict(engine.iter_weights())
    head = weights["score.weight"]
    assert head.shape == (1, 32) and float(weights["score.bias"]) == 0.0
    # normal(0, initializer_range = 0.02): a 32-sample std well inside (0.005, 0.05); not zeros, not the LM head
    assert 0.005 < float(head.std()) < 0.05
