"""Reference training engine: log-prob alignment, gradient accumulation, skipped steps, LR schedule."""

from __future__ import annotations

import io
import math
from types import SimpleNamespace

import pytest
import torch

from verl.engines.micro_batch import fixed_size_plan, restore_order, token_budget_plan, trim_padding
from verl.engines.optim import lr_multiplier
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import make_tiny_model

PROMPT_LEN, RESP_LEN = 5, 4


def _batch(seed: int = 0, bs: int = 4) -> DataProto:
    """Left-padded prompts of different lengths and right-padded responses of different lengths."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [5, 3, 2, 4, 5, 1, 3, 2][:bs]
    resp_lens = [4, 2, 1, 3, 0, 4, 2, 3][:bs]
    data = ragged_rl_batch(prompt_lens, resp_lens, PROMPT_LEN, RESP_LEN, g, meta_info={"temperature": 0.7})
    data.batch["advantages"] = torch.randn(bs, RESP_LEN, generator=g) * data.batch["response_mask"]
    return data


def _reference_log_probs(model: torch.nn.Module, data: DataProto, temperature: float) -> torch.Tensor:
    """Independent oracle: run each row alone, unpadded, and read the response positions."""
    out = torch.zeros(len(data), RESP_LEN)
    for i in range(len(data)):
        mask = data.batch["attention_mask"][i].bool()
        ids = data.batch["input_ids"][i][mask].unsqueeze(0)
        n_resp = int(data.batch["response_mask"][i].sum())
        if n_resp == 0:
            continue
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / temperature
        logp = torch.log_softmax(logits, -1)
        n = ids.shape[1]
        for t in range(n_resp):
            pos = n - n_resp - 1 + t
            out[i, t] = float(logp[pos, ids[0, pos + 1]])
    return out


def _engine(optim=None, **kw) -> ReferenceTrainingEngine:
    settings = EngineSettings(**{"mini_batch_size": 4, "micro_batch_size": 2, "infer_micro_batch_size": 3, **kw})
    return ReferenceTrainingEngine(make_tiny_model(seed=1), settings, optim=optim, total_training_steps=10)


def _optim(lr=1e-2, **kw):
    return SimpleNamespace(lr=lr, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0, **kw)


@pytest.mark.parametrize("dynamic", [False, True])
def test_log_probs_match_unpadded_per_row_forward(dynamic):
    data = _batch(bs=8)
    engine = _engine(infer_use_dynamic_bsz=dynamic, infer_max_token_len=12)
    out = engine.compute_log_prob(data, calculate_entropy=True)
    expected = _reference_log_probs(engine.model, data, 0.7)
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["old_log_probs"][mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert torch.all(out.batch["old_log_probs"][~mask] == 0)
    assert torch.all(out.batch["entropys"][mask] > 0)


def test_non_positive_temperature_is_refused():
    # K09's value checks on the engine live in test_reference_training_positions.py.
    engine = _engine()
    with pytest.raises(ValueError, match="temperature"):
        engine.forward_micro_batch(_batch().batch, 0.0)


def _ppo_like_loss(micro, outputs, norm):
    # token-mean over the whole mini-batch: sum(mask * -A * logp) / batch_num_tokens.
    mask = micro.batch["response_mask"]
    loss = -(micro.batch["advantages"] * outputs["log_probs"] * mask).sum() / norm["batch_num_tokens"]
    return loss, {"actor/pg_loss": float(loss.detach())}


def test_gradient_accumulation_equals_one_pass_k04():
    data = _batch(bs=4)
    grads, losses = [], []
    for micro in (1, 4):
        engine = _engine(optim=_optim(), micro_batch_size=micro)
        # Capture the accumulated gradient right before the optimizer step.
        captured = {}
        real_step = engine.optimizer.step

        def step(captured=captured, engine=engine, real_step=real_step):
            captured["g"] = torch.cat([p.grad.flatten() for p in engine.model.parameters() if p.grad is not None])
            return real_step()

        engine.optimizer.step = step
        engine.optimizer.step._wrapped_by_lr_sched = True  # silence torch's "step overridden" warning
        metrics = engine.train_batch(data, _ppo_like_loss)
        grads.append(captured["g"])
        losses.append(sum(metrics["actor/pg_loss"]))
    # The summed micro-batch losses equal the one-pass loss, and so do the gradients.
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)


def test_train_changes_weights_and_nonfinite_step_is_skipped():
    data = _batch(bs=4)
    engine = _engine(optim=_optim())
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    metrics = engine.train_batch(data, _ppo_like_loss)
    assert any(not torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
    assert metrics["actor/skipped_steps"] == [0.0]

    def nan_loss(micro, outputs, norm):
        return outputs["log_probs"].sum() * float("nan"), {}

    frozen = {k: v.clone() for k, v in engine.model.state_dict().items()}
    metrics = engine.train_batch(data, nan_loss)
    assert math.isnan(metrics["actor/grad_norm"][0])
    assert metrics["actor/skipped_steps"] == [1.0]
    assert all(torch.equal(frozen[k], v) for k, v in engine.model.state_dict().items())


def test_state_dict_round_trip_reproduces_next_update():
    data = _batch(bs=4)
    # Warmup over half of 10 steps: the LR changes every step, so a lost scheduler state shows.
    a = _engine(optim=_optim(lr_warmup_steps_ratio=0.5))
    a.train_batch(data, _ppo_like_loss)
    buffer = io.BytesIO()  # through bytes, as a checkpoint on disk: state_dict() holds live references
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b = _engine(optim=_optim(lr_warmup_steps_ratio=0.5))
    b.load_state_dict(torch.load(buffer, weights_only=False))
    assert b.lr_scheduler.last_epoch == a.lr_scheduler.last_epoch == 1
    ma = a.train_batch(data, _ppo_like_loss)
    mb = b.train_batch(data, _ppo_like_loss)
    assert ma["actor/lr"] == mb["actor/lr"] == [pytest.approx(1e-2 * 1 / 5)]
    for (k, va), (_, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(va, vb), k
    assert b.global_step == 2


def test_step_semantics_one_update_per_mini_batch_per_epoch_and_one_lr_step_per_call():
    data = _batch(bs=8)
    engine = _engine(optim=_optim(lr_warmup_steps_ratio=0.5), mini_batch_size=4, ppo_epochs=2)
    metrics = engine.train_batch(data, _ppo_like_loss)
    # 8 rows / mini-batch 4 = 2 updates per epoch, x 2 epochs; warmup 5 steps: step 0 runs at lr 0.
    assert len(metrics["actor/grad_norm"]) == 4
    assert metrics["actor/lr"] == [0.0] * 4
    assert engine.lr_scheduler.last_epoch == 1
    metrics = engine.train_batch(data, _ppo_like_loss)
    assert metrics["actor/lr"] == [pytest.approx(1e-2 / 5)] * 4


def test_forward_only_engine_refuses_to_train():
    with pytest.raises(RuntimeError, match="forward-only"):
        _engine().train_batch(_batch(), _ppo_like_loss)


def test_lr_multiplier_values():
    # Warmup 2 of 10 steps, cosine to 0.1: values computed by hand from the formula.
    kw = {"warmup": 2, "total": 10, "kind": "cosine", "min_lr_ratio": 0.1, "num_cycles": 0.5}
    assert lr_multiplier(0, **kw) == 0.0
    assert lr_multiplier(1, **kw) == 0.5
    assert lr_multiplier(2, **kw) == pytest.approx(1.0)
    assert lr_multiplier(6, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(10, **kw) == pytest.approx(0.1)
    assert lr_multiplier(5, warmup=0, total=10, kind="constant", min_lr_ratio=0, num_cycles=0.5) == 1.0
    with pytest.raises(ValueError, match="lr_scheduler_type"):
        lr_multiplier(5, warmup=0, total=10, kind="linear", min_lr_ratio=0, num_cycles=0.5)


def test_micro_batch_plans_cover_every_row_once():
    assert fixed_size_plan(5, 2) == [[0, 1], [2, 3], [4]]
    lens = torch.tensor([3, 9, 4, 8, 2])
    plan = token_budget_plan(lens, 16)
    assert sorted(i for g in plan for i in g) == [0, 1, 2, 3, 4]
    assert all(len(g) * max(int(lens[i]) for i in g) <= 16 for g in plan)
    with pytest.raises(ValueError, match="exceeds the token budget"):
        token_budget_plan(lens, 8)
    outs = [torch.tensor([[float(i)] for i in g]) for g in plan]
    assert restore_order(plan, outs).flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_trim_padding_drops_only_shared_pad_columns():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0, 0]])
    ids = torch.arange(14).view(2, 7)
    ids2, mask2, _, left, kept = trim_padding(ids, mask, mask, response_len=3)
    assert (left, kept) == (1, 1)
    assert mask2.tolist() == [[0, 1, 1, 1], [1, 1, 1, 0]]
    assert ids2[:, 0].tolist() == [1, 8]


def test_token_budget_counts_longest_prompt_plus_longest_response():
    # Both rows hold 101 tokens, but together they run at width 100 + 100 after trimming.
    lens, resp = torch.tensor([101, 101]), torch.tensor([1, 100])
    assert sorted(map(sorted, token_budget_plan(lens, 250, response_lens=resp))) == [[0], [1]]
    assert sorted(map(sorted, token_budget_plan(lens, 400, response_lens=resp))) == [[0, 1]]
    # Without response lengths the width is the longest row (the older, optimistic estimate).
    assert sorted(map(sorted, token_budget_plan(lens, 250))) == [[0, 1]]
