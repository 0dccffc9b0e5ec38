"""The ``hf`` rollout engine's own model load (no shared actor module) applies ``actor_rollout_ref.model``'s
``override_config`` and ``trust_remote_code``, through the plugin's factory as the worker calls it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl.config import load_config, role_options
from verl.engines.reference.builders import HFRolloutOptions
from verl.engines.reference.builders import build_hf_rollout_engine as _factory
from verl.models import load_tokenizer
from verl.testing.tiny import make_tiny_model, save_tiny_model

HF = SimpleNamespace(options_cls=HFRolloutOptions)  # role_options reads only the spec's options_cls


def build_hf_rollout_engine(cfg, **kwargs):
    """The ``hf`` factory called as the worker calls it (the validated rollout options)."""
    return _factory(cfg, options=role_options(cfg, "rollout", HF), **kwargs)


OVERRIDE = {"num_hidden_layers": 1, "rms_norm_eps": 0.25}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _config(model_dir, *overrides: str):
    return load_config(overrides=[f"actor_rollout_ref.model.path={model_dir}", *overrides])


def _override_arg(mapping: dict) -> str:
    return "actor_rollout_ref.model.override_config={" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def test_standalone_load_builds_the_overridden_model(model_dir):
    cfg = _config(model_dir, _override_arg(OVERRIDE))
    engine = build_hf_rollout_engine(cfg, model=str(model_dir), tokenizer=load_tokenizer(model_dir), device="cpu")
    assert engine.owns_model
    assert (engine.model.config.num_hidden_layers, engine.model.config.rms_norm_eps) == (1, 0.25)
    # The override shaped the built module (set before the weights were loaded), not only the config object.
    assert len(engine.model.model.layers) == 1
    assert engine.model.model.norm.variance_epsilon == 0.25

    # Oracle: the saved weights in a model built by hand from the saved config with the two values changed.
    saved = make_tiny_model(len(load_tokenizer(model_dir)))
    config = saved.config
    config.num_hidden_layers, config.rms_norm_eps = 1, 0.25
    expected = type(saved)(config).eval()
    missing, unexpected = expected.load_state_dict(saved.state_dict(), strict=False)
    assert missing == [] and all(k.startswith("model.layers.1.") for k in unexpected)
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        got = engine.model(input_ids=ids).logits
        want = expected(input_ids=ids).logits
        full = saved(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - full).abs().max() > 1e-3  # the two-layer model answers differently: the test can fail


def test_no_override_loads_the_saved_model(model_dir):
    engine = build_hf_rollout_engine(
        _config(model_dir), model=str(model_dir), tokenizer=load_tokenizer(model_dir), device="cpu"
    )
    assert len(engine.model.model.layers) == 2 and engine.model.config.rms_norm_eps == 1e-6


def test_unknown_override_key_is_refused_naming_it(model_dir):
    cfg = _config(model_dir, _override_arg({"rms_norm_epsilon": 0.1}))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.override_config\.rms_norm_epsilon.*rms_norm_eps"):
        build_hf_rollout_engine(cfg, model=str(model_dir), tokenizer=load_tokenizer(model_dir), device="cpu")


def test_trust_remote_code_reaches_the_config_model_and_tokenizer_loads(model_dir, monkeypatch):
    import transformers

    seen: list[tuple[str, object]] = []
    for cls_name in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"):
        cls = getattr(transformers, cls_name)
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _name=cls_name, _original=original, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code")))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    cfg = _config(model_dir, "actor_rollout_ref.model.trust_remote_code=true")
    seen.clear()  # the config check may read the model config itself
    build_hf_rollout_engine(cfg, model=str(model_dir), tokenizer=None, device="cpu")
    names = {name for name, _ in seen}
    assert {"AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"} <= names
    assert all(trust is True for _, trust in seen), seen
