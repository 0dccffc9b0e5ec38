"""Sequence packing (``use_remove_padding``): layout, plans, and that it changes no log-prob and no update."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from verl.engines import attention
from verl.engines.packing import pack_batch, packed_token_plan
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import make_tiny_model

PROMPT_LEN, RESP_LEN = 6, 5
PROMPT_LENS = [6, 3, 2, 4, 5, 1, 3, 2]
RESP_LENS = [5, 2, 1, 3, 0, 4, 5, 3]


def _batch(bs: int = 8, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    data = ragged_rl_batch(PROMPT_LENS[:bs], RESP_LENS[:bs], PROMPT_LEN, RESP_LEN, g, meta_info={"temperature": 0.7})
    data.batch["advantages"] = torch.randn(bs, RESP_LEN, generator=g) * data.batch["response_mask"]
    return data


# ---------------------------------------------------------------- layout


def test_pack_batch_layout_by_hand() -> None:
    # Row 0: prompt [11, 12], response [21, 22]; row 1: prompt [13], response [23] (one pad each side).
    ids = torch.tensor([[11, 12, 21, 22], [0, 13, 23, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 0]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack_batch(ids, mask, pos, ids[:, 2:])
    assert packed.input_ids.tolist() == [[11, 12, 21, 22, 13, 23]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1]]
    assert packed.cu_seq_lens.tolist() == [0, 4, 6]
    assert packed.max_len == 4
    # Logit at packed position t scores token t + 1: 21 <- 12 (1), 22 <- 21 (2), 23 <- 13 (4).
    assert packed.logit_index.tolist() == [1, 2, 4]
    assert packed.labels.tolist() == [21, 22, 23]
    assert packed.unpack(torch.tensor([1.0, 2.0, 3.0])).tolist() == [[1.0, 2.0], [3.0, 0.0]]


def test_pack_batch_refuses_layouts_it_cannot_pack() -> None:
    ids = torch.tensor([[5, 6, 7, 8]])
    holey = torch.tensor([[1, 0, 1, 1]])  # a hole inside the row: not one contiguous run
    assert pack_batch(ids, holey, holey.cumsum(-1) - 1, ids[:, 2:]) is None
    no_prompt = torch.tensor([[0, 0, 1, 1]])  # the first response token has no logit before it
    assert pack_batch(ids, no_prompt, (no_prompt.cumsum(-1) - 1).clamp(min=0), ids[:, 2:]) is None


def test_packed_token_plan_respects_budget_and_covers_every_row() -> None:
    lens = torch.tensor([7, 3, 9, 2, 5, 5, 1, 8])
    plan = packed_token_plan(lens, 10)
    assert sorted(i for group in plan for i in group) == list(range(8))
    assert all(int(lens[group].sum()) <= 10 for group in plan)
    # 40 tokens, budget 10: first-fit decreasing fills 4 bins exactly ([9, 1] [8, 2] [7, 3] [5, 5]).
    assert sorted(sorted(int(lens[i]) for i in group) for group in plan) == [[1, 9], [2, 8], [3, 7], [5, 5]]
    with pytest.raises(ValueError, match="exceeds the token budget"):
        packed_token_plan(torch.tensor([11]), 10)


# ---------------------------------------------------------------- attention kernels


def test_packed_attention_equals_block_diagonal_mask_forward_and_backward() -> None:
    torch.manual_seed(0)
    lens = [5, 1, 7]
    n, heads, kv_heads, dim = sum(lens), 4, 2, 8
    q = torch.randn(1, heads, n, dim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, kv_heads, n, dim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, kv_heads, n, dim, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    out = attention._packed(q, k, v, cu, 0.0, dim**-0.5)
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor(lens))
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=allowed
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v])
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v])
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_decode_attention_equals_sdpa_with_padding_mask() -> None:
    assert attention._register()
    torch.manual_seed(1)
    bs, heads, kv_heads, length, dim = 3, 6, 2, 9, 8
    q = torch.randn(bs, heads, 1, dim)
    k, v = torch.randn(bs, kv_heads, length, dim), torch.randn(bs, kv_heads, length, dim)
    mask = torch.ones(bs, 1, 1, length, dtype=torch.bool)
    mask[0, ..., :4] = False  # a left-padded row
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    want, _ = attention._sdpa_forward(module, q, k, v, mask, scaling=0.3)
    got, _ = attention.attention_forward(module, q, k, v, mask, scaling=0.3)
    torch.testing.assert_close(got, want)


# ---------------------------------------------------------------- engine: same log-probs, same update


def _engine(packed: bool, *, optim=None, dynamic: bool = True) -> ReferenceTrainingEngine:
    settings = EngineSettings(
        mini_batch_size=8,
        micro_batch_size=3,
        use_dynamic_bsz=dynamic,
        max_token_len=24,
        infer_micro_batch_size=3,
        infer_use_dynamic_bsz=dynamic,
        infer_max_token_len=24,
        use_remove_padding=packed,
    )
    return ReferenceTrainingEngine(make_tiny_model(seed=1), settings, optim=optim, total_training_steps=4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_packed_log_probs_and_entropy_equal_padded(dynamic: bool) -> None:
    data = _batch()
    padded = _engine(False, dynamic=dynamic).compute_log_prob(data, calculate_entropy=True)
    engine = _engine(True, dynamic=dynamic)
    assert engine._packed and attention.is_installed(engine.model)
    packed = engine.compute_log_prob(data, calculate_entropy=True)
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(packed.batch[key], padded.batch[key], atol=1e-5, rtol=1e-5)
    # padding slots stay exactly 0, and the empty response row (4) is all zeros
    assert bool((packed.batch["old_log_probs"][data.batch["response_mask"] == 0] == 0).all())
    assert packed.batch["old_log_probs"][4].abs().sum() == 0


def test_packed_update_equals_padded_update() -> None:
    from verl.config import load_config
    from verl.workers.losses import make_ppo_loss

    data = _batch()
    optim = SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    engines = {packed: _engine(packed, optim=copy.copy(optim)) for packed in (False, True)}
    old = engines[False].compute_log_prob(data).batch["old_log_probs"]
    # Off-policy old log-probs so that the ratio and the clip matter in the update.
    data.batch["old_log_probs"] = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(3))
    loss = make_ppo_loss(load_config(None).actor_rollout_ref.actor)
    grads: dict[bool, list[torch.Tensor]] = {}
    for packed, engine in engines.items():
        # Compare the (clipped) gradient the optimizer applies: Adam's first step is sign-like, so
        # near-zero gradient entries would turn float noise into lr-sized differences in the weights.
        engine.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, packed=packed, engine=engine: grads.__setitem__(
                packed, [p.grad.detach().clone() for p in engine.model.parameters()]
            )
        )
    metrics = {packed: engine.train_batch(copy.deepcopy(data), loss) for packed, engine in engines.items()}
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac"):
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-4, abs=1e-6), key
    assert metrics[False]["actor/grad_norm"][0] > 0
    for (name, _), a, b in zip(engines[False].model.named_parameters(), grads[False], grads[True], strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4, msg=name)


def test_model_without_sdpa_stays_padded() -> None:
    model = make_tiny_model(seed=1)
    model.set_attn_implementation("eager")
    engine = ReferenceTrainingEngine(model, EngineSettings(use_remove_padding=True))
    assert not engine._packed
    data = _batch()
    reference = _engine(False).compute_log_prob(data).batch["old_log_probs"]
    torch.testing.assert_close(engine.compute_log_prob(data).batch["old_log_probs"], reference, atol=1e-5, rtol=1e-5)
