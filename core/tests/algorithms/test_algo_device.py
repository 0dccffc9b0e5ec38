"""The same maths on an accelerator as on CPU (runs only where CUDA is available)."""

import numpy as np
import pytest
import torch

from verl.algorithms import (
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_gae_advantage_return,
    get_adv_estimator_fn,
    kl_penalty,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device"),
]

RNG = np.random.default_rng(11)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
REWARDS = torch.tensor(RNG.normal(size=(4, 4)), dtype=torch.float32)
INDEX = np.array(["a", "a", "b", "b"], dtype=object)


def both(fn):
    cpu = fn("cpu")
    cuda = fn("cuda")
    return cpu, cuda


@pytest.mark.parametrize("name", ["grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"])
def test_group_estimators_match_cpu(name):
    est = get_adv_estimator_fn(name)
    cpu, cuda = both(lambda d: est(token_level_rewards=REWARDS.to(d), response_mask=MASK.to(d), index=INDEX)[0])
    assert cuda.device.type == "cuda"
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-5, atol=1e-6)


def test_gae_matches_cpu():
    values = torch.tensor(RNG.normal(size=(4, 4)), dtype=torch.float32)
    cpu, cuda = both(lambda d: compute_gae_advantage_return(REWARDS.to(d), values.to(d), MASK.to(d), 0.99, 0.95)[0])
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY))
def test_policy_losses_run_and_match_cpu(name):
    old = torch.tensor(-np.abs(RNG.normal(size=(4, 4))), dtype=torch.float32)
    new = old + 0.1
    adv = torch.tensor(RNG.normal(size=(4, 4)), dtype=torch.float32)

    def go(d):
        torch.manual_seed(0)
        lp = new.to(d).requires_grad_(True)
        loss, _ = POLICY_LOSS_REGISTRY[name](old.to(d), lp, adv.to(d), MASK.to(d))
        loss.backward()
        return loss.detach(), lp.grad

    (l_cpu, g_cpu), (l_gpu, g_gpu) = both(go)
    assert torch.isfinite(g_gpu).all()
    if name != "clip_cov":  # random token selection differs between devices
        torch.testing.assert_close(l_gpu.cpu(), l_cpu, rtol=1e-5, atol=1e-6)


def test_kl_and_agg_on_device():
    logp = torch.full((2, 3), -1.0, device="cuda", requires_grad=True)
    out = agg_loss(
        kl_penalty(logp, torch.full((2, 3), -1000.0, device="cuda"), "low_var_kl+"), MASK[:2, :3].cuda(), "token-mean"
    )
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(logp.grad).all()
