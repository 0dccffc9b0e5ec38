"""``model.override_config`` / ``model.trust_remote_code`` / ``critic.model.*`` reach the loads (issue #15).

Oracles: the values written into the override (read back from the built module's config), transformers'
own ``from_pretrained`` kwargs (seen through a recording stand-in), and, for the critic's packed forward,
each row run alone without padding.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from verl.config import load_config, role_options
from verl.engines.reference.builders import ReferenceEngineOptions, build_reference_training_engine, critic_settings
from verl.engines.reference.critic import ReferenceCriticEngine
from verl.models.hf_config import load_hf_config, split_override_config
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import save_tiny_model

#: role_options reads only options_cls of the spec: the reference engine's.
REFERENCE = SimpleNamespace(options_cls=ReferenceEngineOptions)


def _build(cfg, role, model):
    """The reference factory called as the worker calls it (the role's validated options)."""
    return build_reference_training_engine(cfg, role=role, model=model, options=role_options(cfg, role, REFERENCE))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def _cfg(tiny, *overrides):
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny}",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            *overrides,
        ]
    )


def test_override_config_is_set_before_the_weights_load(tiny):
    hf = load_hf_config(tiny, override_config={"attention_dropout": 0.25, "model_config": {"rms_norm_eps": 1e-3}})
    assert hf.attention_dropout == 0.25 and hf.rms_norm_eps == 1e-3  # model_config unwrapped as verl does
    assert split_override_config({"attn_implementation": "eager", "x": 1}) == (
        {"attn_implementation": "eager"},
        {"x": 1},
    )
    assert load_hf_config(tiny, override_config={"attn_implementation": "eager"})._attn_implementation == "eager"


def test_a_key_the_model_config_lacks_is_refused_with_a_spelling_hint(tiny):
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref\.model\.override_config\.attention_dropuot.*attention_dropout"
    ):
        load_hf_config(tiny, override_config={"attention_dropuot": 0.1})


def test_actor_ref_and_critic_engines_are_built_with_their_own_override_config(tiny):
    cfg = _cfg(
        tiny,
        "+actor_rollout_ref.model.override_config.attention_dropout=0.25",
        "+critic.model.override_config.rms_norm_eps=0.001",
        "algorithm.adv_estimator=gae",
    )
    actor = _build(cfg, "actor", tiny)
    ref = _build(cfg, "ref", tiny)
    critic = _build(cfg, "critic", tiny)
    assert actor.model.config.attention_dropout == 0.25 and ref.model.config.attention_dropout == 0.25
    assert actor.model.model.layers[0].self_attn.attention_dropout == 0.25  # the built module, not only its config
    assert critic.model.config.rms_norm_eps == 0.001 and critic.model.config.attention_dropout == 0.0
    assert actor.model.config.rms_norm_eps != 0.001


def test_trust_remote_code_reaches_config_model_and_tokenizer_loads(tiny, monkeypatch):
    import transformers

    seen: list[tuple[str, object]] = []
    for cls_name in ("AutoConfig", "AutoModelForCausalLM", "AutoModelForTokenClassification", "AutoTokenizer"):
        cls = getattr(transformers, cls_name)
        original = cls.from_pretrained.__func__

        def record(klass, *args, _name=cls_name, _orig=original, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code")))
            return _orig(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(record))
    from verl.models import load_tokenizer

    cfg = _cfg(tiny, "actor_rollout_ref.model.trust_remote_code=true", "algorithm.adv_estimator=gae")
    _build(cfg, "actor", tiny)
    load_tokenizer(tiny, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)
    assert ("AutoConfig", True) in seen and ("AutoModelForCausalLM", True) in seen and ("AutoTokenizer", True) in seen
    seen.clear()
    _build(cfg, "critic", tiny)  # critic.model.trust_remote_code stays false
    assert seen and all(flag is False for _, flag in seen)


def test_critic_packs_sequences_by_default_and_matches_each_row_alone(tiny):
    cfg = _cfg(tiny, "algorithm.adv_estimator=gae")
    settings = critic_settings(cfg)
    assert settings.use_remove_padding is True  # verl's default
    engine = ReferenceCriticEngine(tiny, settings)
    assert engine._packed
    padded = ReferenceCriticEngine(tiny, critic_settings(_cfg(tiny, "critic.model.use_remove_padding=false")))
    assert not padded._packed
    padded.model.load_state_dict(engine.model.state_dict())  # the fresh value heads differ per load
    prompt_lens, resp_lens = [5, 3, 2, 4], [4, 2, 1, 0]
    data = ragged_rl_batch(prompt_lens, resp_lens, 5, 4, torch.Generator().manual_seed(0))
    expected = torch.zeros(4, 4, dtype=torch.float64)
    model = copy.deepcopy(engine.model)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        if r:
            ids = data.batch["input_ids"][i][data.batch["attention_mask"][i].bool()].unsqueeze(0)
            with torch.no_grad():
                expected[i, :r] = model(input_ids=ids).logits[0, p - 1 : p - 1 + r, 0].double()
    for eng in (engine, padded):
        torch.testing.assert_close(eng.compute_values(data).batch["values"].double(), expected, atol=1e-5, rtol=1e-5)


def test_a_critic_tokenizer_with_another_vocabulary_is_refused(tiny, tmp_path):
    from transformers import AutoTokenizer

    from verl.workers.critic import load_critic_tokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    tok.add_tokens(["<extra_critic_token>"])
    tok.save_pretrained(tmp_path / "other_tok")
    same = tmp_path / "same_tok"
    AutoTokenizer.from_pretrained(tiny).save_pretrained(same)
    loaded = load_critic_tokenizer(_cfg(tiny, f"critic.model.tokenizer_path={same}"), tiny)
    assert loaded.get_vocab() == AutoTokenizer.from_pretrained(tiny).get_vocab()
    with pytest.raises(ValueError, match=r"critic\.model\.tokenizer_path=.*1 \(token, id\) pairs differ"):
        load_critic_tokenizer(_cfg(tiny, f"critic.model.tokenizer_path={tmp_path / 'other_tok'}"), tiny)
