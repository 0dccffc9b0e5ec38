"""Reference critic engine: value alignment, value-model loading, one update vs a hand-written AdamW step."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from verl.engines.reference.critic import ReferenceCriticEngine, load_value_model
from verl.engines.reference.training import EngineSettings
from verl.protocol import DataProto
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import save_tiny_model
from verl.workers.losses import make_value_loss

PROMPT_LEN, RESP_LEN = 5, 4
PROMPT_LENS = [5, 3, 2, 4]
RESP_LENS = [4, 2, 1, 0]


def _value_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForTokenClassification

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=104,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        classifier_dropout=0.0,
    )
    model = LlamaForTokenClassification(cfg).float()
    with torch.no_grad():  # a non-zero bias so a misplaced head shows up
        model.score.bias.fill_(0.3)
    return model.eval()


def _batch(seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    data = ragged_rl_batch(PROMPT_LENS, RESP_LENS, PROMPT_LEN, RESP_LEN, g)
    data.batch["returns"] = torch.randn(len(PROMPT_LENS), RESP_LEN, generator=g) * data.batch["response_mask"]
    return data


def _manual_values(model: torch.nn.Module, data: DataProto) -> torch.Tensor:
    """Each row alone, unpadded: value of response token t = head output at position prompt_len - 1 + t."""
    out = torch.zeros(len(data), RESP_LEN, dtype=torch.float64)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESP_LENS, strict=True)):
        if r == 0:
            continue
        ids = data.batch["input_ids"][i][data.batch["attention_mask"][i].bool()].unsqueeze(0)
        with torch.no_grad():
            head = model(input_ids=ids).logits[0, :, 0].double()
        out[i, :r] = head[p - 1 : p - 1 + r]
    return out


@pytest.mark.parametrize("micro,dynamic", [(None, False), (1, False), (3, False), (None, True)])
def test_values_align_with_an_unpadded_forward(micro, dynamic):
    model = _value_model()
    data = _batch()
    settings = EngineSettings(infer_micro_batch_size=micro, infer_use_dynamic_bsz=dynamic, infer_max_token_len=10)
    engine = ReferenceCriticEngine(copy.deepcopy(model), settings)
    values = engine.compute_values(data).batch["values"]
    assert values.dtype == torch.float32 and values.shape == (4, RESP_LEN)
    torch.testing.assert_close(values.double(), _manual_values(model, data), atol=1e-5, rtol=1e-5)
    assert values[3].abs().sum() == 0 and values[2, 1:].abs().sum() == 0  # padding holds 0


def test_causal_lm_checkpoint_loads_as_backbone_plus_fresh_scalar_head(tmp_path):
    from transformers import AutoModelForCausalLM

    path = save_tiny_model(tmp_path / "tiny")
    lm = AutoModelForCausalLM.from_pretrained(path)
    vm = load_value_model(path, torch.float32)
    assert type(vm).__name__ == "LlamaForTokenClassification"
    assert tuple(vm.score.weight.shape) == (1, 32)
    assert torch.count_nonzero(vm.score.bias) == 0  # HF _init_weights: bias 0
    assert vm.dropout.p == 0.0
    lm_backbone = {k.removeprefix("model."): v for k, v in lm.state_dict().items() if k.startswith("model.")}
    vm_backbone = {k.removeprefix("model."): v for k, v in vm.state_dict().items() if k.startswith("model.")}
    assert lm_backbone.keys() == vm_backbone.keys()
    assert all(torch.equal(lm_backbone[k], vm_backbone[k]) for k in lm_backbone)


def test_unloadable_value_model_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="critic.model.path"):
        load_value_model(tmp_path / "missing", torch.float32)


def test_one_update_equals_a_hand_written_adamw_step_on_the_value_loss():
    lr, wd, eps, clip = 0.01, 0.01, 1e-8, 0.2
    model = _value_model(seed=1)
    data = _batch(seed=2)
    old = _manual_values(model, data).float()
    data.batch["values"] = old + 0.3 * data.batch["response_mask"]  # V_old off by 0.3: clipping matters
    optim = SimpleNamespace(lr=lr, betas=(0.9, 0.999), weight_decay=wd, clip_grad=1e9)
    settings = EngineSettings(mini_batch_size=4, micro_batch_size=2, clip_grad=1e9)
    engine = ReferenceCriticEngine(copy.deepcopy(model), settings, optim=optim)
    critic_cfg = SimpleNamespace(loss_agg_mode="token-mean", cliprange_value=clip)
    metrics = engine.train_batch(data, make_value_loss(critic_cfg))

    # Oracle: the value loss of the whole batch written out (0.5 * token mean of the max of the two
    # squared errors), its gradient, then AdamW's first step by hand: m/(1-b1) = g, v/(1-b2) = g^2.
    oracle = copy.deepcopy(model)
    mask = data.batch["response_mask"].bool()
    vpred = torch.zeros(4, RESP_LEN)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESP_LENS, strict=True)):
        if r:
            ids = data.batch["input_ids"][i][data.batch["attention_mask"][i].bool()].unsqueeze(0)
            vpred = vpred.index_put(
                (torch.tensor([i] * r), torch.arange(r)), oracle(input_ids=ids).logits[0, p - 1 : p - 1 + r, 0]
            )
    ret, vold = data.batch["returns"], data.batch["values"]
    clipped = torch.max(torch.min(vpred, vold + clip), vold - clip)
    per_tok = torch.max((vpred - ret) ** 2, (clipped - ret) ** 2)
    loss = 0.5 * per_tok[mask].sum() / mask.sum()
    loss.backward()
    expected_clipfrac = float(((clipped - ret) ** 2 > (vpred - ret) ** 2)[mask].float().mean())
    with torch.no_grad():
        for p in oracle.parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            p.mul_(1 - lr * wd).sub_(lr * g / (g.abs() + eps))
    got = dict(engine.model.named_parameters())
    for name, p in oracle.named_parameters():
        # atol: 0.1% of a step (lr); elements with |g| ~ eps are sign-like in Adam's first step, ~1e-6 apart.
        torch.testing.assert_close(got[name], p, atol=1e-5, rtol=1e-5)
    start = dict(model.named_parameters())
    moved = max(float((got[n] - start[n]).abs().max()) for n in start)
    assert moved == pytest.approx(lr * (1 + wd), rel=0.01)  # Adam's first step moves by ~lr
    assert metrics["critic/vf_loss"] == [pytest.approx(float(loss), rel=1e-5)]
    assert metrics["critic/vf_clipfrac"] == [pytest.approx(expected_clipfrac, abs=1e-6)]
    assert 0 < expected_clipfrac < 1
    assert metrics["critic/vpred_mean"] == [pytest.approx(float(vpred[mask].mean()), rel=1e-5, abs=1e-6)]
    assert metrics["critic/lr"] == [lr] and len(metrics["critic/grad_norm"]) == 1
    assert metrics["critic/skipped_steps"] == [0.0] and "actor/grad_norm" not in metrics
