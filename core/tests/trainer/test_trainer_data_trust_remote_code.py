"""``data.trust_remote_code`` (verl: the driver's tokenizer load for the dataset) reaches the trainer's tokenizer."""

from __future__ import annotations

import pytest

import verl.models
from verl.config import load_config
from verl.trainer.ppo_trainer import PPOTrainer


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], False),
        (["data.trust_remote_code=true"], True),
        (["actor_rollout_ref.model.trust_remote_code=true"], True),
    ],
)
def test_tokenizer_load_trusts_remote_code(monkeypatch, tmp_path, overrides, expected) -> None:
    seen: dict = {}

    def fake_load_tokenizer(path, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(verl.models, "resolve_model_path", lambda path: tmp_path)
    monkeypatch.setattr(verl.models, "load_tokenizer", fake_load_tokenizer)
    trainer = PPOTrainer(load_config(overrides=overrides), tmp_path / "run")
    with pytest.raises(_Stop):
        trainer.init()
    assert seen["trust_remote_code"] is expected
