"""verl keys kept so its scripts load: the ``reward`` section, grad_clip, min_lr, optimizer, switches (issue #15)."""

from __future__ import annotations

import math

import pytest
import torch

from verl.config import ConfigError, load_config

ARR = "actor_rollout_ref"


def _keys(error: ConfigError) -> list[str]:
    return [issue.key for issue in error.issues]


def test_reward_section_moves_onto_reward_model_and_custom_reward_function() -> None:
    cfg = load_config(
        overrides=[
            "reward.num_workers=3",
            "reward.reward_manager.name=dapo",
            "+reward.reward_kwargs.max_resp_len=512",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward.reward_kwargs.overlong_buffer_cfg.len=128",
            "reward.custom_reward_function.path=/tmp/score.py",
            "reward.custom_reward_function.name=my_score",
            "reward.reward_model.enable=True",
            "reward.reward_model.model_path=/models/rm",
            "reward.reward_manager.source=register",  # verl's default: accepted
        ]
    )
    rm = cfg.reward_model
    assert (rm.num_workers, rm.reward_manager, rm.enable, rm.model.path) == (3, "dapo", True, "/models/rm")
    assert rm.reward_kwargs == {"max_resp_len": 512, "overlong_buffer_cfg": {"enable": True, "len": 128}}
    assert (cfg.custom_reward_function.path, cfg.custom_reward_function.name) == ("/tmp/score.py", "my_score")


def test_reward_section_set_both_ways_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["reward.num_workers=3", "reward_model.num_workers=4"])
    assert _keys(info.value) == ["reward.num_workers"]
    assert "also set as reward_model.num_workers" in str(info.value)


@pytest.mark.parametrize(
    ("override", "text"),
    [
        ("reward.reward_model.rollout.name=vllm", "rollout engine"),
        ("reward.reward_model.enable_resource_pool=True", "resource pool of its own"),
        ("reward.reward_manager.source=importlib", "reward-manager class loaded from a file"),
        ("reward.sandbox_fusion.url=http://sandbox", "sandbox-fusion"),
        ("reward.bogus=1", "verl's reward section has"),
    ],
)
def test_reward_section_refuses_what_is_not_built(override: str, text: str) -> None:
    with pytest.raises(ConfigError, match=text):
        load_config(overrides=[override])


def test_grad_clip_must_agree_with_optim_clip_grad() -> None:
    assert load_config(overrides=[f"{ARR}.actor.grad_clip=1.0"]).actor_rollout_ref.actor.grad_clip == 1.0
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ARR}.actor.grad_clip=0.5"])
    assert _keys(info.value) == [f"{ARR}.actor.grad_clip"] and "optim.clip_grad=0.5" in str(info.value)


def test_min_lr_is_the_cosine_floor() -> None:
    from verl.engines.optim import build_lr_scheduler, build_optimizer

    cfg = load_config(
        overrides=[
            f"{ARR}.actor.optim.lr=1e-3",
            f"{ARR}.actor.optim.min_lr=2e-4",
            f"{ARR}.actor.optim.lr_scheduler_type=cosine",
        ]
    )
    optim = cfg.actor_rollout_ref.actor.optim
    param = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([param], optim)
    sched = build_lr_scheduler(opt, optim, total_training_steps=10)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # Megatron/verl cosine, no warmup: lr(t) = min + (max - min) * 0.5 * (1 + cos(pi * t / T)).
    expected = [2e-4 + 8e-4 * 0.5 * (1 + math.cos(math.pi * t / 10)) for t in range(11)]
    assert lrs == pytest.approx(expected, rel=1e-9)
    assert lrs[-1] == pytest.approx(2e-4)


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        ([f"{ARR}.actor.optim.min_lr=1.0"], "must be in"),
        ([f"{ARR}.actor.optim.min_lr=1e-7", f"{ARR}.actor.optim.min_lr_ratio=0.1"], "keep one"),
    ],
)
def test_min_lr_errors(overrides: list[str], text: str) -> None:
    with pytest.raises(ConfigError, match=text) as info:
        load_config(overrides=overrides)
    assert _keys(info.value) == [f"{ARR}.actor.optim.min_lr"]


def test_min_lr_with_a_constant_schedule_warns() -> None:
    warnings: list[str] = []
    load_config(overrides=[f"{ARR}.actor.optim.min_lr=1e-7"], on_warning=warnings.append)
    assert any("min_lr" in w and "constant" in w for w in warnings)


@pytest.mark.parametrize("name", ["AdamW", "Adam"])
def test_optimizer_name_picks_the_torch_class(name: str) -> None:
    from verl.engines.optim import build_optimizer

    cfg = load_config(overrides=[f"{ARR}.actor.optim.optimizer={name}", f"{ARR}.actor.optim.lr=0.1"])
    optim = cfg.actor_rollout_ref.actor.optim  # weight_decay 0.01 (verl's default)
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = build_optimizer([param], optim)
    assert type(opt).__name__ == name
    param.grad = torch.tensor([0.5, 0.25])
    opt.step()
    # First Adam step: m_hat = g', v_hat = g'^2 -> update lr * g' / (|g'| + eps) = lr * sign(g') (eps 1e-8).
    # Adam folds weight decay into the gradient (g' = g + wd * p); AdamW decays the weight: p * (1 - lr * wd).
    p0, g, lr, wd = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25]), 0.1, 0.01
    if name == "Adam":
        gp = g + wd * p0
        expected = p0 - lr * gp / (gp.abs() + 1e-8)
    else:
        expected = p0 * (1 - lr * wd) - lr * g / (g.abs() + 1e-8)
    torch.testing.assert_close(param.detach(), expected)
    with pytest.raises(ConfigError, match="optim.optimizer"):
        load_config(overrides=[f"{ARR}.actor.optim.optimizer=SGD"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (f"{ARR}.actor.checkpoint.strict=False", f"{ARR}.actor.checkpoint.strict"),
        ("trainer.use_legacy_worker_impl=enable", "trainer.use_legacy_worker_impl"),
        (f"{ARR}.nccl_timeout=0", f"{ARR}.nccl_timeout"),
        (f"{ARR}.rollout.cudagraph_capture_sizes=[8,16]", f"{ARR}.rollout.cudagraph_capture_sizes"),  # hf: none
        (f"{ARR}.rollout.disable_log_stats=False", f"{ARR}.rollout.disable_log_stats"),  # hf keeps no stats
    ],
)
def test_switches_refused_off_what_is_built(override: str, key: str) -> None:
    from verl.plugins import get_plugin_manager

    with pytest.raises(ConfigError) as info:  # the real hf spec: its check_config refuses the rollout keys
        load_config(overrides=[override], plugin_manager=get_plugin_manager())
    assert _keys(info.value) == [key]


def test_switches_at_verls_values_load() -> None:
    cfg = load_config(
        overrides=[
            f"{ARR}.actor.checkpoint.strict=True",
            "trainer.use_legacy_worker_impl=disable",
            f"{ARR}.nccl_timeout=14400",
            f"{ARR}.rollout.disable_log_stats=True",
            "data.trust_remote_code=True",
        ]
    )
    assert cfg.actor_rollout_ref.nccl_timeout == 14400 and cfg.data.trust_remote_code is True
