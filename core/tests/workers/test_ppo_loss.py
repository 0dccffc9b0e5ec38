"""The actor's PPO loss (``verl.workers.losses.make_ppo_loss``): K04 through the real training engine, K10,
and metrics as additive micro-batch contributions.

Every expected value comes from an independent oracle written here: a per-row, unpadded forward of an
identical tiny model, and the vanilla PPO / low-var-KL / entropy / aggregation formulas of
``verl/trainer/ppo/core_algos.py`` spelt out by hand (empty rows are left out of every sequence count, K08).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import attrs
import numpy as np
import pytest
import torch

from verl.config import load_config
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.tiny import make_tiny_model
from verl.workers.losses import make_ppo_loss

PROMPT_LEN, RESP_LEN = 5, 4
TEMPERATURE = 0.7
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# Row 2 has an EMPTY response; prompts are left-padded, responses right-padded, all lengths differ.
PROMPT_LENS = [5, 3, 2, 4, 1, 3]
RESP_LENS = [4, 2, 0, 3, 1, 4]
KL_COEF, ENT_COEF, CLIP, CLIP_C = 0.1, 0.01, 0.2, 3.0


@pytest.fixture(scope="module")
def base_actor():
    return load_config().actor_rollout_ref.actor


def _actor(base, **kw):
    return attrs.evolve(base, **kw)


# ----------------------------------------------------------------------------------------------- oracle
def _row_forward(model, ids: torch.Tensor, n_resp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs and entropies of one unpadded row (default positions 0..n-1), with grad."""
    logits = model(input_ids=ids.unsqueeze(0)).logits[0].float() / TEMPERATURE
    n = ids.shape[0]
    logits = logits[n - n_resp - 1 : n - 1]
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[n - n_resp :].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _aggregate(per_row: list[torch.Tensor], mode: str) -> torch.Tensor:
    """Hand-written agg over a list of per-row token losses (empty rows contribute nothing, K08)."""
    rows = [r for r in per_row if r.numel() > 0]
    n_tokens = sum(r.numel() for r in rows)
    if mode == "token-mean":
        return sum(r.sum() for r in rows) / n_tokens
    if mode == "token-sum":
        return sum(r.sum() for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(r.mean() for r in rows) / len(rows)
    seq_sum = sum(r.sum() for r in rows) / len(rows)
    return seq_sum / RESP_LEN if mode == "seq-mean-token-sum-norm" else seq_sum


def _ppo_token_losses(logp, old, adv):
    """Vanilla PPO with dual clip, per token (core_algos.compute_policy_loss_vanilla)."""
    ratio = torch.exp(logp - old)
    l1, l2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
    clipped = torch.maximum(l1, l2)
    return torch.where(adv < 0, torch.minimum(clipped, -adv * CLIP_C), clipped), (l2 > l1)


def _low_var_kl(logp, ref):
    x = torch.clamp(ref - logp, -20, 20)
    return torch.clamp(torch.exp(x) - x - 1, -10, 10)


def _oracle(data: DataProto, mode: str) -> dict:
    """One pass over the whole mini-batch: loss terms, metrics and the gradient, all by hand."""
    model = make_tiny_model(seed=1)
    b = data.batch
    pg_rows, kl_rows, ent_rows, clip_flags, neg_log_ratio = [], [], [], [], []
    for i in range(len(data)):
        n = RESP_LENS[i]
        ids = b["input_ids"][i][b["attention_mask"][i].bool()]
        if n == 0:
            continue
        logp, entropy = _row_forward(model, ids, n)
        old, adv, ref = b["old_log_probs"][i, :n], b["advantages"][i, :n], b["ref_log_prob"][i, :n]
        pg, clipped = _ppo_token_losses(logp, old, adv)
        pg_rows.append(pg)
        kl_rows.append(_low_var_kl(logp, ref))
        ent_rows.append(entropy)
        clip_flags.append(clipped.float())
        neg_log_ratio.append((old - logp).detach())
    pg, kl, ent = (_aggregate(r, mode) for r in (pg_rows, kl_rows, ent_rows))
    total = pg + KL_COEF * kl - ENT_COEF * ent
    total.backward()
    pg, kl, ent, total = (x.detach() for x in (pg, kl, ent, total))
    params = dict(model.named_parameters())
    grads = torch.cat(
        [
            (params[k].grad if params[k].grad is not None else torch.zeros_like(params[k])).flatten()
            for k in sorted(params)
        ]
    )
    return {
        "grad": grads,
        "actor/pg_loss": float(pg),
        "actor/kl_loss": float(kl),
        "actor/entropy_loss": float(ent),
        "actor/loss": float(total),
        # token-weighted mini-batch means
        "actor/pg_clipfrac": float(torch.cat(clip_flags).mean()),
        "actor/ppo_kl": float(torch.cat(neg_log_ratio).mean()),
    }


# ------------------------------------------------------------------------------------------------- data
def _batch() -> DataProto:
    bs = len(PROMPT_LENS)
    g = torch.Generator().manual_seed(0)
    prompts = torch.full((bs, PROMPT_LEN), 3)
    responses = torch.full((bs, RESP_LEN), 3)
    pmask = torch.zeros(bs, PROMPT_LEN, dtype=torch.long)
    rmask = torch.zeros(bs, RESP_LEN, dtype=torch.long)
    for i in range(bs):
        prompts[i, PROMPT_LEN - PROMPT_LENS[i] :] = torch.randint(4, 100, (PROMPT_LENS[i],), generator=g)
        pmask[i, PROMPT_LEN - PROMPT_LENS[i] :] = 1
        responses[i, : RESP_LENS[i]] = torch.randint(4, 100, (RESP_LENS[i],), generator=g)
        rmask[i, : RESP_LENS[i]] = 1
    attention_mask = torch.cat([pmask, rmask], dim=1)
    input_ids = torch.cat([prompts, responses], dim=1)
    # old/ref log-probs: the current policy's, shifted by up to ±0.4 so that some ratios clip (ε = 0.2).
    model = make_tiny_model(seed=1)
    current = torch.zeros(bs, RESP_LEN)
    with torch.no_grad():
        for i in range(bs):
            if RESP_LENS[i]:
                current[i, : RESP_LENS[i]] = _row_forward(model, input_ids[i][attention_mask[i].bool()], RESP_LENS[i])[
                    0
                ]
    shift = (torch.rand(bs, RESP_LEN, generator=g) - 0.5) * 0.8
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": rmask,
            "old_log_probs": (current + shift) * rmask,
            "ref_log_prob": (current - shift.flip(0)) * rmask,
            "advantages": torch.randn(bs, RESP_LEN, generator=g) * rmask,
        },
        meta_info={"temperature": TEMPERATURE},
    )


@pytest.fixture(scope="module")
def batch():
    return _batch()


def _train_and_capture(data: DataProto, loss_fn, **settings) -> tuple[torch.Tensor, dict]:
    """Run ``train_batch`` (one mini-batch) and capture the accumulated gradient before optimizer.step."""
    s = EngineSettings(mini_batch_size=len(data), clip_grad=1e9, **settings)
    optim = SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    engine = ReferenceTrainingEngine(make_tiny_model(seed=1), s, optim=optim, total_training_steps=2)
    captured = {}
    real_step = engine.optimizer.step
    names = dict(engine.model.named_parameters())

    def step():
        # A parameter without .grad got no gradient at all: count it as zeros.
        grads = [names[k].grad if names[k].grad is not None else torch.zeros_like(names[k]) for k in sorted(names)]
        captured["g"] = torch.cat([g.flatten() for g in grads])
        return real_step()

    engine.optimizer.step = step
    engine.optimizer.step._wrapped_by_lr_sched = True  # silence torch's "step overridden" warning
    metrics = engine.train_batch(data, loss_fn)
    return captured["g"], metrics


PLANS = {
    "micro1": {"micro_batch_size": 1},  # the empty row is a micro-batch of its own
    "micro3": {"micro_batch_size": 3},
    "full": {"micro_batch_size": None},
    "dynamic": {"use_dynamic_bsz": True, "max_token_len": 14},
}


# ------------------------------------------------------------------------------------------------- K04
@pytest.mark.parametrize("mode", MODES)
def test_k04_engine_accumulation_equals_one_pass_for_every_mode_and_split(base_actor, batch, mode):
    actor = _actor(
        base_actor,
        loss_agg_mode=mode,
        use_kl_loss=True,
        kl_loss_coef=KL_COEF,
        kl_loss_type="low_var_kl",
        entropy_coeff=ENT_COEF,
        clip_ratio=CLIP,
        clip_ratio_low=CLIP,
        clip_ratio_high=CLIP,
        clip_ratio_c=CLIP_C,
    )
    expected = _oracle(batch, mode)
    assert 0 < expected["actor/pg_clipfrac"] < 1  # the data exercises both clipped and unclipped tokens
    for plan, settings in PLANS.items():
        grad, metrics = _train_and_capture(batch, make_ppo_loss(actor), **settings)
        assert torch.isfinite(grad).all(), plan
        torch.testing.assert_close(grad, expected["grad"], atol=2e-6, rtol=1e-4, msg=f"{plan}: gradient")
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/loss"):
            assert len(metrics[key]) == 1, (plan, key)  # one mini-batch: micro-batch contributions summed
            # float32 summation over differently sized micro-batches: ~1e-5 relative on AVX2 (MKL) boxes
            assert metrics[key][0] == pytest.approx(expected[key], rel=5e-5, abs=1e-7), (plan, key)
        # (c) through the engine: ratio-type metrics summed over micro-batches = mini-batch value
        for key in ("actor/pg_clipfrac", "actor/ppo_kl"):
            assert metrics[key][0] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), (plan, key)


def test_k04_micro_batch_of_only_an_empty_response_trains(base_actor, batch):
    # A micro-batch holding only the empty row has no graph; it must add nothing and not crash.
    actor = _actor(base_actor, loss_agg_mode="token-mean")
    empty_only = batch[[2]]
    assert int(empty_only.batch["response_mask"].sum()) == 0
    grad, metrics = _train_and_capture(empty_only, make_ppo_loss(actor), micro_batch_size=1)
    assert torch.count_nonzero(grad) == 0
    assert metrics["actor/pg_loss"] == [0.0]
    assert metrics["actor/skipped_steps"] == [0.0]


# ------------------------------------------------------------------------------------------------- K10
def _micro(logp_old, adv, mask, ref=None) -> DataProto:
    tensors = {"old_log_probs": logp_old, "advantages": adv, "response_mask": mask}
    if ref is not None:
        tensors["ref_log_prob"] = ref
    return DataProto.from_dict(tensors=tensors)


def _norm(mask: torch.Tensor) -> dict:
    row_len = mask.sum(-1)
    return {"dp_size": 1, "batch_num_tokens": int(row_len.sum()), "global_batch_size": int((row_len > 0).sum())}


def test_k10_case_numbers_through_make_ppo_loss(base_actor):
    # One token with ratio 1: pg = -A = 0.3 (A = -0.3); k1 KL = logp - ref = 0.2; coef 0.1 -> 0.32, not 0.28.
    actor = _actor(base_actor, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k1", entropy_coeff=0.0)
    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.2]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 1)
    micro = _micro(logp.detach().clone(), torch.tensor([[-0.3]], dtype=torch.float64), mask, ref)
    loss, metrics = make_ppo_loss(actor)(micro, {"log_probs": logp}, _norm(mask))
    assert loss.item() == pytest.approx(0.32, abs=1e-12)
    assert metrics["actor/pg_loss"] == pytest.approx(0.3, abs=1e-12)
    assert metrics["actor/kl_loss"] == pytest.approx(0.2, abs=1e-12)
    loss.backward()
    # kl = logp - ref, so d kl / d ref = -1 and d total / d ref = -(d total / d kl): d total / d kl = +0.1.
    assert -float(ref.grad) == pytest.approx(0.1, abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kl_type", ["low_var_kl", "k1", "k2"])
def test_k10_total_is_pg_plus_coef_times_kl_by_numpy(base_actor, mode, kl_type):
    rng = np.random.default_rng(3)
    mask_np = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=np.float64)
    logp_np = -rng.uniform(0.1, 3.0, size=mask_np.shape)
    old_np = logp_np + rng.uniform(-0.4, 0.4, size=mask_np.shape)
    ref_np = logp_np + rng.uniform(-1.0, 1.0, size=mask_np.shape)
    adv_np = rng.normal(size=mask_np.shape)
    coef = 0.25
    actor = _actor(
        base_actor, loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=coef, kl_loss_type=kl_type, entropy_coeff=0.0
    )
    logp = torch.tensor(logp_np, requires_grad=True)
    ref = torch.tensor(ref_np, requires_grad=True)
    mask = torch.tensor(mask_np)
    micro = _micro(torch.tensor(old_np), torch.tensor(adv_np), mask, ref)
    loss, metrics = make_ppo_loss(actor)(micro, {"log_probs": logp}, _norm(mask))

    # numpy oracle
    ratio = np.exp(logp_np - old_np)
    l1, l2 = -adv_np * ratio, -adv_np * np.clip(ratio, 1 - 0.2, 1 + 0.2)
    clipped = np.maximum(l1, l2)
    pg_tok = np.where(adv_np < 0, np.minimum(clipped, -adv_np * 3.0), clipped)
    d = logp_np - ref_np
    if kl_type == "k1":
        kl_tok, dkl_dref = d, -np.ones_like(d)
    elif kl_type == "k2":
        kl_tok, dkl_dref = 0.5 * d**2, -d
    else:
        x = -d
        kl_tok, dkl_dref = np.exp(x) - x - 1, np.exp(x) - 1
    rows = [r for r in range(mask_np.shape[0]) if mask_np[r].sum() > 0]

    def agg(tok):
        sums = [(tok[r] * mask_np[r]).sum() for r in rows]
        lens = [mask_np[r].sum() for r in rows]
        return {
            "token-mean": sum(sums) / sum(lens),
            "token-sum": sum(sums),
            "seq-mean-token-sum": sum(sums) / len(rows),
            "seq-mean-token-mean": sum(s / n for s, n in zip(sums, lens, strict=True)) / len(rows),
            "seq-mean-token-sum-norm": sum(sums) / len(rows) / mask_np.shape[1],
        }[mode]

    pg, kl = agg(pg_tok), agg(kl_tok)
    assert loss.item() == pytest.approx(pg + coef * kl, rel=1e-12, abs=1e-14)
    assert metrics["actor/pg_loss"] == pytest.approx(pg, rel=1e-12, abs=1e-14)
    assert metrics["actor/kl_loss"] == pytest.approx(kl, rel=1e-12, abs=1e-14)
    loss.backward()
    # The ref log-probs reach the loss only through the KL term, so d total/d ref = coef * d kl_loss/d ref:
    # the chain factor d total / d kl_loss is +coef (a flipped sign would give -coef).
    # agg is linear in the token losses: its weight on token (r, t) is agg(one-hot at (r, t)).
    dkl_loss_dref = np.zeros_like(d)
    for r, t in zip(*np.nonzero(mask_np), strict=True):
        unit = np.zeros_like(d)
        unit[r, t] = 1.0
        dkl_loss_dref[r, t] = agg(unit) * dkl_dref[r, t]
    np.testing.assert_allclose(ref.grad.numpy(), coef * dkl_loss_dref, rtol=1e-10, atol=1e-14)
    assert math.isfinite(loss.item())


# ---------------------------------------------------------------------------------------- (c) metrics
@pytest.mark.parametrize("mode", MODES)
def test_metrics_are_additive_over_micro_batches(base_actor, mode):
    # Split one mini-batch 3 ways (one piece holding only an empty row); summing each metric over the
    # pieces gives the mini-batch value computed by hand, for clipfrac and ppo_kl (token-weighted).
    rng = np.random.default_rng(11)
    lens = [3, 0, 1, 4, 2]
    width = 4
    mask_np = (np.arange(width)[None, :] < np.array(lens)[:, None]).astype(np.float64)
    logp_np = -rng.uniform(0.1, 2.0, size=mask_np.shape)
    old_np = logp_np + rng.uniform(-0.5, 0.5, size=mask_np.shape)
    adv_np = rng.normal(size=mask_np.shape)
    actor = _actor(base_actor, loss_agg_mode=mode, use_kl_loss=False, entropy_coeff=0.0)
    loss_fn = make_ppo_loss(actor)
    mask = torch.tensor(mask_np)
    norm = _norm(mask)
    summed: dict[str, float] = {}
    total_loss = 0.0
    for rows in ([0, 1], [2, 3], [4]):
        micro = _micro(torch.tensor(old_np[rows]), torch.tensor(adv_np[rows]), mask[rows])
        loss, metrics = loss_fn(micro, {"log_probs": torch.tensor(logp_np[rows])}, norm)
        total_loss += float(loss)
        for key, value in metrics.items():
            summed[key] = summed.get(key, 0.0) + value
    ratio = np.exp(logp_np - old_np)
    l1, l2 = -adv_np * ratio, -adv_np * np.clip(ratio, 0.8, 1.2)
    valid = mask_np.astype(bool)
    clipfrac = float((l2 > l1)[valid].mean())
    ppo_kl = float((old_np - logp_np)[valid].mean())
    assert 0 < clipfrac < 1
    assert summed["actor/pg_clipfrac"] == pytest.approx(clipfrac, rel=1e-12)
    assert summed["actor/ppo_kl"] == pytest.approx(ppo_kl, rel=1e-12)
    assert summed["actor/pg_loss"] == pytest.approx(total_loss, rel=1e-12)
    # and the summed pg_loss equals the loss of one pass over the whole mini-batch
    one_pass, one_metrics = loss_fn(
        _micro(torch.tensor(old_np), torch.tensor(adv_np), mask), {"log_probs": torch.tensor(logp_np)}, norm
    )
    assert total_loss == pytest.approx(float(one_pass), rel=1e-12)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert summed[key] == pytest.approx(one_metrics[key], rel=1e-12, abs=1e-15), key
