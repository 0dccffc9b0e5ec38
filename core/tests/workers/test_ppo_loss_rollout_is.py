"""``rollout_is_weights`` through the training engine: every micro-batch split carries the column to the loss.

Oracle: the vanilla PPO loss written by hand on a per-row, unpadded forward of an identical tiny model,
each token's loss multiplied by its weight, token-mean over the mini-batch (verl: "All losses multiply by
rollout_is_weights when present"); its gradient is compared with the engine's accumulated one.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl.config import load_config
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.tiny import make_tiny_model
from verl.workers.losses import make_ppo_loss

PROMPT_LEN, RESP_LEN = 4, 4
PROMPT_LENS, RESP_LENS = [4, 2, 3, 1], [4, 3, 1, 2]
CLIP, CLIP_C = 0.2, 3.0


def _row_logp(model, ids: torch.Tensor, n_resp: int) -> torch.Tensor:
    logits = model(input_ids=ids.unsqueeze(0)).logits[0].float()
    n = ids.shape[0]
    logp = torch.log_softmax(logits[n - n_resp - 1 : n - 1], -1)
    return logp.gather(-1, ids[n - n_resp :].unsqueeze(-1)).squeeze(-1)


def _batch(weights: torch.Tensor | None) -> DataProto:
    g = torch.Generator().manual_seed(5)
    bs = len(PROMPT_LENS)
    prompts, responses = torch.full((bs, PROMPT_LEN), 3), torch.full((bs, RESP_LEN), 3)
    pmask, rmask = torch.zeros(bs, PROMPT_LEN, dtype=torch.long), torch.zeros(bs, RESP_LEN, dtype=torch.long)
    for i in range(bs):
        prompts[i, PROMPT_LEN - PROMPT_LENS[i] :] = torch.randint(4, 100, (PROMPT_LENS[i],), generator=g)
        pmask[i, PROMPT_LEN - PROMPT_LENS[i] :] = 1
        responses[i, : RESP_LENS[i]] = torch.randint(4, 100, (RESP_LENS[i],), generator=g)
        rmask[i, : RESP_LENS[i]] = 1
    attention_mask = torch.cat([pmask, rmask], 1)
    input_ids = torch.cat([prompts, responses], 1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": rmask,
        "old_log_probs": (torch.rand(bs, RESP_LEN, generator=g) * -3.0) * rmask,
        "advantages": torch.randn(bs, RESP_LEN, generator=g) * rmask,
    }
    if weights is not None:
        tensors["rollout_is_weights"] = weights * rmask
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def _oracle_grad(data: DataProto) -> torch.Tensor:
    model = make_tiny_model(seed=2)
    b = data.batch
    total = torch.zeros(())
    for i, n in enumerate(RESP_LENS):
        logp = _row_logp(model, b["input_ids"][i][b["attention_mask"][i].bool()], n)
        old, adv = b["old_log_probs"][i, :n], b["advantages"][i, :n]
        ratio = torch.exp(logp - old)
        clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
        per_token = torch.where(adv < 0, torch.minimum(clipped, -adv * CLIP_C), clipped)
        w = b["rollout_is_weights"][i, :n] if "rollout_is_weights" in b.keys() else torch.ones(n)
        total = total + (w * per_token).sum()
    (total / sum(RESP_LENS)).backward()
    return torch.cat([p.grad.flatten() for _, p in sorted(model.named_parameters()) if p.grad is not None])


def _engine_grad(data: DataProto, **settings) -> torch.Tensor:
    s = EngineSettings(mini_batch_size=len(data), clip_grad=1e9, **settings)
    optim = SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    engine = ReferenceTrainingEngine(make_tiny_model(seed=2), s, optim=optim, total_training_steps=2)
    captured = {}
    real_step = engine.optimizer.step
    params = sorted(engine.model.named_parameters())

    def step():
        captured["g"] = torch.cat([p.grad.flatten() for _, p in params if p.grad is not None])
        return real_step()

    engine.optimizer.step = step
    engine.optimizer.step._wrapped_by_lr_sched = True  # silence torch's "step overridden" warning
    engine.train_batch(data, make_ppo_loss(load_config().actor_rollout_ref.actor))
    return captured["g"]


WEIGHTS = torch.tensor([[0.0, 1.5, 0.5, 2.0], [1.0, 0.25, 3.0, 0.0], [0.7, 0.0, 0.0, 0.0], [2.5, 0.1, 0.0, 0.0]])


@pytest.mark.parametrize(
    "settings",
    [{"micro_batch_size": 1}, {"micro_batch_size": 3}, {"use_dynamic_bsz": True, "max_token_len": 9}],
    ids=["micro1", "micro3", "dynamic"],
)
def test_every_micro_batch_split_applies_the_weights(settings):
    data = _batch(WEIGHTS)
    want = _oracle_grad(data)
    got = _engine_grad(data, **settings)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    unweighted = _oracle_grad(_batch(None))
    assert (want - unweighted).abs().max() > 1e-3  # the weights change the gradient on this batch


def test_zero_weights_give_no_gradient():
    got = _engine_grad(_batch(torch.zeros(4, RESP_LEN)), micro_batch_size=2)
    assert float(got.abs().max()) == 0.0
