"""LoRA through peft in the reference training engine (issue #21): the base model before the first update, only
adapters train, merged sync = unmerged forward, exact resume, the peft folders, bad targets and adapters."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
import torch

from verl.engines.lora import AdapterDisabledReference, LoraSettings
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import make_tiny_model, save_tiny_model

RANK, ALPHA = 4, 32  # scale alpha / r = 8: a wrong scale shows in the merged-sync test


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    data = ragged_rl_batch([5, 3, 2, 4], [4, 2, 1, 3], 5, 4, g, meta_info={"temperature": 0.7})
    data.batch["advantages"] = torch.randn(4, 4, generator=g) * data.batch["response_mask"]
    return data


def _loss(micro, outputs, norm):
    mask = micro.batch["response_mask"]
    loss = (-(micro.batch["advantages"] * outputs["log_probs"]) * mask).sum() / norm["batch_num_tokens"]
    return loss, {}


def _optim():
    return SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01, lr_warmup_steps=0)


def _engine(lora: LoraSettings | None = LoraSettings(rank=RANK, alpha=ALPHA), optim=_optim, model=None):  # noqa: B008
    settings = EngineSettings(mini_batch_size=4, micro_batch_size=2, lora=lora)
    return ReferenceTrainingEngine(
        model if model is not None else make_tiny_model(seed=1),
        settings,
        optim=optim() if optim else None,
        total_training_steps=10,
    )


def _log_probs(engine, data):
    return engine.compute_log_prob(data).batch["old_log_probs"]


def test_zero_b_gives_the_base_log_probs_and_one_update_changes_only_adapters():
    data = _batch()
    base_lp = _log_probs(_engine(lora=None, optim=None), data)
    engine = _engine()
    # peft: B = 0 at init, so (alpha / r) * B @ A adds exactly 0: bitwise the base model.
    assert torch.equal(_log_probs(engine, data), base_lp)
    trainable = {n: p.detach().clone() for n, p in engine.model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in engine.model.named_parameters() if not p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # Optimizer state only for adapters: 2 layers x r x (in + out) of q, o (32->32), k, v (32->16: 2 key/value
    # heads of 8) and gate, up, down (32<->64); the LM head is not a target of all-linear.
    opt_params = [p for group in engine.optimizer.param_groups for p in group["params"]]
    expected = 2 * RANK * (2 * (32 + 32) + 2 * (32 + 16) + 3 * (32 + 64))
    assert sum(p.numel() for p in opt_params) == sum(p.numel() for p in trainable.values()) == expected
    engine.train_batch(data, _loss)
    after = dict(engine.model.named_parameters())
    for name, value in frozen.items():
        assert torch.equal(after[name], value), name  # weight decay did not touch the base either
    changed = [n for n, v in trainable.items() if not torch.equal(after[n], v)]
    assert any(".lora_B." in n for n in changed) and any(".lora_A." in n for n in changed)
    assert not torch.equal(_log_probs(engine, data), base_lp)
    # The reference policy = the same module with adapters disabled = the base model, after updates too.
    assert torch.equal(AdapterDisabledReference(engine).compute_log_prob(data).batch["old_log_probs"], base_lp)


def test_merged_sync_equals_the_unmerged_forward_and_leaves_the_module_alone():
    data = _batch()
    engine = _engine()
    engine.train_batch(data, _loss)
    engine.train_batch(_batch(1), _loss)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    merged = dict(engine.iter_weights())
    plain = make_tiny_model(seed=7)
    assert sorted(merged) == sorted(plain.state_dict())  # the base model's names, no adapter keys
    assert [(n, tuple(merged[n].shape)) for n, _ in engine.weight_manifest()] == engine.weight_manifest()
    plain.load_state_dict(merged, strict=True)
    receiver = _engine(lora=None, optim=None, model=plain)
    torch.testing.assert_close(_log_probs(receiver, data), _log_probs(engine, data), atol=2e-6, rtol=0)
    # Independent merge of one layer: W + (alpha / r) * B @ A.
    prefix = "model.layers.1.mlp.down_proj"
    w, a, b = (before[f"{prefix}.{k}"] for k in ("base_layer.weight", "lora_A.default.weight", "lora_B.default.weight"))
    torch.testing.assert_close(merged[f"{prefix}.weight"], w + (ALPHA / RANK) * b @ a, atol=1e-6, rtol=1e-6)
    assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())


def test_resume_is_exact_and_the_checkpoint_holds_only_the_adapter():
    torch.manual_seed(0)  # peft draws A at random: both runs start from the same adapter
    straight = _engine()
    for seed in (0, 1):
        straight.train_batch(_batch(seed), _loss)
    torch.manual_seed(0)
    first = _engine()
    first.train_batch(_batch(0), _loss)
    state = first.state_dict()
    assert state["lora"] and all(".lora_A." in k or ".lora_B." in k for k in state["model"])
    buffer = io.BytesIO()
    torch.save(state, buffer)
    torch.manual_seed(123)  # another fresh A: the checkpoint must replace it
    resumed = _engine()
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    resumed.train_batch(_batch(1), _loss)
    want, got = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="lora_rank"):
        _engine(lora=None).load_state_dict(state)


def test_save_hf_writes_a_merged_model_and_a_peft_adapter(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = save_tiny_model(tmp_path / "base", seed=1)
    engine = _engine(lora=LoraSettings(rank=RANK, alpha=ALPHA, base_model=str(base_dir)), model=None)
    engine.train_batch(_batch(), _loss)
    engine.save_hf(tmp_path / "out")
    data = _batch()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(
        _log_probs(_engine(lora=None, optim=None, model=merged), data), _log_probs(engine, data), atol=2e-6, rtol=0
    )
    adapter = tmp_path / "out" / "lora_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (RANK, ALPHA, str(base_dir))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter)
    torch.testing.assert_close(
        _log_probs(_engine(lora=None, optim=None, model=peft_model.merge_and_unload()), data),
        _log_probs(engine, data),
        atol=2e-6,
        rtol=0,
    )
    # Continue from that adapter (lora_adapter_path): the same function as the engine that wrote it.
    again = _engine(lora=LoraSettings(rank=1, alpha=1, adapter_path=str(adapter)), model=make_tiny_model(seed=1))
    torch.testing.assert_close(_log_probs(again, data), _log_probs(engine, data), atol=1e-6, rtol=0)
    assert sum(p.numel() for p in again.model.parameters() if p.requires_grad) == sum(
        p.numel() for p in engine.model.parameters() if p.requires_grad
    )

    # An adapter whose base model differs (another width): an error naming both.
    with pytest.raises(ValueError, match=r"trained on base model .*base.*model.path=.*wide") as err:
        _engine(
            lora=LoraSettings(rank=RANK, adapter_path=str(adapter), base_model="wide"),
            model=make_tiny_model(hidden_size=48),
        )
    assert str(base_dir) in str(err.value)


def test_target_modules_matching_nothing_lists_the_linear_modules():
    with pytest.raises(ValueError, match="target_modules") as err:
        _engine(lora=LoraSettings(rank=RANK, target_modules=["qkv_proj"]))
    for name in ("q_proj", "k_proj", "down_proj", "lm_head"):
        assert name in str(err.value)
    with pytest.raises(ValueError, match="no adapter_config.json"):
        _engine(lora=LoraSettings(rank=RANK, adapter_path="/nonexistent/adapter"))
