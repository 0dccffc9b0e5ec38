"""The trainer side of LoRA adapter serving (``model.lora.merge`` unset/false with a rollout that serves adapters).

``lora_adapter()`` must give exactly what peft itself would load: the check writes the tensors and config as a
folder and loads it with ``PeftModel.from_pretrained`` on a fresh base model, whose log-probs must equal the
actor's. The colocated sync's adapter path is shown against a recording stand-in rollout (names: ``stand_in``):
it shows the call order and payload, not that any serving library works (verl-vllm's tests do that with vLLM).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from verl.engines.lora import LoraSettings
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine, serves_adapter
from verl.testing.tiny import make_tiny_model

RANK, ALPHA = 4, 8


def _actor() -> ReferenceTrainingEngine:
    optim = SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    actor = ReferenceTrainingEngine(
        make_tiny_model(seed=1), EngineSettings(lora=LoraSettings(rank=RANK, alpha=ALPHA)), optim=optim
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # peft's B = 0 would make any adapter look right
        for name, p in actor.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return actor


def test_lora_adapter_is_what_peft_loads(tmp_path) -> None:
    from peft import PeftModel
    from safetensors.torch import save_file

    actor = _actor()
    tensors, config = actor.lora_adapter()
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA and config["peft_type"] == "LORA"
    trainable = [p for p in actor.model.parameters() if p.requires_grad]
    assert len(tensors) == len(trainable) and all(t.device.type == "cpu" for t in tensors.values())
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    loaded = PeftModel.from_pretrained(make_tiny_model(seed=1), str(tmp_path)).eval()
    ids = torch.randint(0, actor.model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = loaded(input_ids=ids).logits
        got = actor.model.eval()(input_ids=ids).logits
        base = make_tiny_model(seed=1).eval()(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert (got - base).abs().max() > 1e-2  # the adapter is not a no-op


class _StandInAdapterRollout:
    """Stand-in for a rollout engine that serves adapters (records calls; no serving library)."""

    serves_lora_adapters = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded: tuple | None = None

    def load_lora_adapter(self, tensors, config) -> None:
        self.calls.append("load_lora_adapter")
        self.loaded = (tensors, config)

    def update_weights(self, weights) -> None:
        self.calls.append("update_weights")


def test_colocated_sync_sends_the_adapter_to_a_stand_in_rollout() -> None:
    actor, rollout = _actor(), _StandInAdapterRollout()
    assert serves_adapter(actor, rollout)
    metrics = ColocatedCheckpointEngine().sync(actor, rollout)
    assert rollout.calls == ["load_lora_adapter"]  # no full-weight stream
    tensors, config = rollout.loaded
    expected, _ = actor.lora_adapter()
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in expected)
    assert metrics["adapter"] is True and metrics["tensors"] == len(expected)
    assert metrics["bytes"] == sum(t.numel() * t.element_size() for t in expected.values())


def test_lora_adapter_without_lora_raises() -> None:
    engine = ReferenceTrainingEngine(make_tiny_model(seed=1), EngineSettings(), optim=None)
    assert not serves_adapter(engine, _StandInAdapterRollout())
    with pytest.raises(RuntimeError, match="no LoRA adapter"):
        engine.lora_adapter()
