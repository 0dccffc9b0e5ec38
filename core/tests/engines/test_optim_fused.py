"""The fused AdamW fast path of ``build_optimizer`` gives the update of the reference AdamW."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from verl.engines.optim import build_optimizer
from verl.testing.tiny import make_tiny_model

OPTIM = SimpleNamespace(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)


def test_cpu_parameters_get_the_fused_kernel_with_the_same_updates():
    fused_model, plain_model = make_tiny_model(seed=3), make_tiny_model(seed=3)
    fused = build_optimizer(fused_model.parameters(), OPTIM)
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for a, b in zip(fused_model.parameters(), plain_model.parameters(), strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        fused.step()
        plain.step()
    for (name, a), b in zip(fused_model.named_parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_tensor_subclasses_keep_the_default_implementation():
    class Shard(torch.Tensor):  # stands in for a DTensor shard
        pass

    param = torch.nn.Parameter(torch.zeros(3))
    assert build_optimizer([param], OPTIM).defaults["fused"] is True
    shard = torch.zeros(3).as_subclass(Shard).requires_grad_()
    assert not build_optimizer([shard], OPTIM).defaults.get("fused")


def test_param_groups_given_as_generators_keep_their_parameters():
    model = make_tiny_model(seed=3)
    groups = [{"params": (p for p in model.parameters()), "weight_decay": 0.0}]
    opt = build_optimizer(groups, OPTIM)
    assert len(opt.param_groups[0]["params"]) == len(list(model.parameters()))
    assert opt.param_groups[0]["weight_decay"] == 0.0 and opt.defaults["fused"] is True
