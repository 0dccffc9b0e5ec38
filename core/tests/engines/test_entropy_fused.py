"""verl's log-prob/entropy switches give the plain path's numbers: chunked entropy, entropy checkpointing,
fused linear log-probs (values and gradients), torch.compile (slow), activation offload, and the engine.

Oracles are independent: a float64 numpy entropy/log-softmax, and the engine's own plain logits path.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.engines.entropy import entropy_from_logits, entropy_from_logits_with_chunking, make_entropy_fn
from verl.engines.fused_linear import check_fusable, fused_log_probs_and_entropy
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import make_tiny_model

PROMPT_LEN, RESP_LEN = 5, 4


def _np_entropy(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    p = np.exp(z - m)
    p /= p.sum(-1, keepdims=True)
    return -(p * np.log(p)).sum(-1)


def _np_log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_entropy_equals_full_entropy_and_numpy(chunk):
    logits = torch.randn(2, 7, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = _np_entropy(logits.numpy())
    full = entropy_from_logits(logits)
    chunked = entropy_from_logits_with_chunking(logits, chunk)
    assert chunked.shape == (2, 7) and chunked.dtype == torch.float32
    np.testing.assert_allclose(full.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chunked.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"chunking": True, "chunk_size": 4}, {"checkpointing": True}, {}])
def test_entropy_fn_gradient_equals_full_entropy_gradient(kw):
    base = torch.randn(9, 30, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    weights = torch.linspace(0.5, 2.0, 9, dtype=torch.float64)
    ref = base.clone().requires_grad_(True)
    (entropy_from_logits(ref) * weights).sum().backward()
    x = base.clone().requires_grad_(True)
    (make_entropy_fn(**kw)(x) * weights).sum().backward()
    tol = {"rtol": 1e-5, "atol": 1e-6}  # the chunked path computes in float32, as verl's
    torch.testing.assert_close(x.grad, ref.grad, **tol)
    # d H / d z_j = -p_j (log p_j + H), by hand
    p = torch.softmax(base, -1)
    h = -(p * p.log()).sum(-1, keepdim=True)
    torch.testing.assert_close(x.grad, (-p * (p.log() + h)) * weights[:, None], **tol)


def test_entropy_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="entropy_from_logits_chunk_size"):
        make_entropy_fn(chunking=True, chunk_size=0)


def test_checkpointing_runs_the_entropy_again_in_backward():
    calls = []

    def counting(z):
        calls.append(1)
        return entropy_from_logits(z)

    x = torch.randn(4, 10, requires_grad=True)
    torch.utils.checkpoint.checkpoint(counting, x, use_reentrant=False).sum().backward()
    assert len(calls) == 2  # what make_entropy_fn(checkpointing=True) relies on: forward + recompute


@pytest.mark.parametrize("chunk", [1, 4, 512])
def test_fused_log_probs_and_entropy_match_numpy_and_logits_gradients(chunk):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(40, 8, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 40, (2, 5), generator=g)
    temp = 0.7
    z = (hidden @ weight.T).numpy() / temp
    lp_np = np.take_along_axis(_np_log_softmax(z), labels.numpy()[..., None], -1)[..., 0]

    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    lp, ent = fused_log_probs_and_entropy(h1, w1, labels, temp, chunk)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (2, 5)
    np.testing.assert_allclose(lp.detach().numpy(), lp_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent.detach().numpy(), _np_entropy(z), rtol=1e-5, atol=1e-5)

    a, b = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    ((lp * a).sum() + (ent * b).sum()).backward()
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logits = (h2 @ w2.T) / temp
    lp2 = torch.log_softmax(logits, -1).gather(-1, labels[..., None])[..., 0]
    ((lp2 * a).sum() + (entropy_from_logits(logits) * b).sum()).backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-6)


def test_fused_gradient_of_log_probs_only_and_frozen_weight():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(6, 8, generator=g, requires_grad=True)
    weight = torch.randn(20, 8, generator=g)  # frozen head
    labels = torch.randint(0, 20, (6,), generator=g)
    lp, _ = fused_log_probs_and_entropy(hidden, weight, labels, 1.0, 4)
    lp.sum().backward()
    ref = hidden.detach().clone().requires_grad_(True)
    torch.log_softmax(ref @ weight.T, -1).gather(-1, labels[:, None]).sum().backward()
    torch.testing.assert_close(hidden.grad, ref.grad)


def test_fused_refuses_bad_shapes_and_biased_heads():
    with pytest.raises(ValueError, match="do not match"):
        fused_log_probs_and_entropy(torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, dtype=torch.long))
    model = make_tiny_model()
    model.lm_head = torch.nn.Linear(32, 104, bias=True)
    with pytest.raises(ValueError, match="bias.*use_fused_kernels=false"):
        check_fusable(model)


def test_fused_forward_keeps_plain_calls_for_a_sharing_rollout():
    # The hf rollout generates through the actor's own module: a call without labels must still give logits.
    from verl.engines.fused_linear import install_fused_forward

    model = make_tiny_model()
    ids = torch.randint(0, 104, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        install_fused_forward(model)
        install_fused_forward(model)  # twice: still one level of patching
        after = model(input_ids=ids).logits
        lp, _ = model(input_ids=ids, select=3, labels=ids[:, -3:], temperature=1.0)
    torch.testing.assert_close(after, before)
    ref = torch.log_softmax(before[:, -4:-1], -1).gather(-1, ids[:, -3:, None])[..., 0]
    torch.testing.assert_close(lp, ref, rtol=1e-5, atol=1e-5)


def test_fused_refuses_a_lora_wrapped_lm_head_naming_the_fix():
    pytest.importorskip("peft")
    from verl.engines.lora import LoraSettings, apply_lora

    model = make_tiny_model()
    apply_lora(model, LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match=r"LoRA adapters.*target_modules.*exclude_modules=\[lm_head\]"):
        check_fusable(model)
    # 'all-linear' leaves the head plain: the same model class is accepted.
    plain = make_tiny_model()
    apply_lora(plain, LoraSettings(rank=4, alpha=8, target_modules="all-linear"))
    check_fusable(plain)


# ---------------------------------------------------------------- the engine


def _batch(seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    data = ragged_rl_batch([5, 3, 2, 4], [4, 2, 1, 3], PROMPT_LEN, RESP_LEN, g, meta_info={"temperature": 0.7})
    data.batch["advantages"] = torch.randn(4, RESP_LEN, generator=g) * data.batch["response_mask"]
    return data


def _engine(**kw) -> ReferenceTrainingEngine:
    settings = EngineSettings(mini_batch_size=4, micro_batch_size=2, infer_micro_batch_size=3, **kw)
    optim = SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    return ReferenceTrainingEngine(make_tiny_model(seed=1), settings, optim=optim, total_training_steps=4)


def _loss(micro, outputs, norm):
    mask = micro.batch["response_mask"].float()
    pg = -(outputs["log_probs"] * micro.batch["advantages"] * mask).sum() / norm["batch_num_tokens"]
    ent = (outputs["entropys"] * mask).sum() / norm["batch_num_tokens"]
    return pg - 0.1 * ent, {"ent": float(ent.detach())}


def _grads(engine: ReferenceTrainingEngine, data: DataProto) -> dict[str, torch.Tensor]:
    """Gradients of one mini-batch (the optimizer is stubbed so the weights stay put)."""
    engine.optimizer.step = lambda: None
    engine.optimizer.zero_grad = lambda set_to_none=True: None
    engine.train_batch(data, _loss)
    return {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}


SWITCHES = [
    {"use_fused_kernels": True},
    {"use_fused_kernels": True, "use_remove_padding": True},
    {"entropy_from_logits_with_chunking": True, "entropy_from_logits_chunk_size": 3},
    {"entropy_checkpointing": True, "use_remove_padding": True},
    {"enable_activation_offload": True, "gradient_checkpointing": True},
]


@pytest.mark.parametrize("kw", SWITCHES, ids=lambda kw: "+".join(kw))
def test_engine_switch_gives_the_plain_log_probs_entropy_and_gradients(kw):
    data = _batch()
    base = {"use_remove_padding": kw.get("use_remove_padding", False)}
    plain, other = _engine(**base), _engine(**kw)
    want = plain.compute_log_prob(data, calculate_entropy=True)
    got = other.compute_log_prob(data, calculate_entropy=True)
    torch.testing.assert_close(got.batch["old_log_probs"], want.batch["old_log_probs"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.batch["entropys"], want.batch["entropys"], rtol=1e-5, atol=1e-5)
    g_want, g_got = _grads(plain, data), _grads(other, data)
    assert g_want.keys() == g_got.keys() and g_want
    for name in g_want:
        torch.testing.assert_close(g_got[name], g_want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_fused_engine_never_builds_the_vocabulary_logits():
    engine = _engine(use_fused_kernels=True)
    shapes = []
    hook = engine.model.lm_head.register_forward_hook(lambda m, i, o: shapes.append(o.shape))
    engine.compute_log_prob(_batch(), calculate_entropy=True)
    hook.remove()
    assert shapes == []  # the head's weight is used chunk by chunk, its module is never called


def test_fused_engine_refuses_another_backend():
    with pytest.raises(ValueError, match="impl_backend='triton'"):
        _engine(use_fused_kernels=True, fused_kernels_backend="triton")


@pytest.mark.slow
def test_torch_compile_entropy_equals_eager():
    """torch.compile on this CPU box takes ~5-20 s for the first graph (inductor C++ build), hence slow."""
    x = torch.randn(13, 57, generator=torch.Generator().manual_seed(4), requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    for kw in ({}, {"chunking": True, "chunk_size": 5}):
        compiled = make_entropy_fn(use_torch_compile=True, **kw)
        out = compiled(x)
        torch.testing.assert_close(out, entropy_from_logits(y), rtol=1e-5, atol=1e-5)
        out.sum().backward()
        entropy_from_logits(y).sum().backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6)
        x.grad = y.grad = None
    other = make_entropy_fn(use_torch_compile=True)(torch.randn(31, 57))  # another row count: dynamic graph
    assert other.shape == (31,)
