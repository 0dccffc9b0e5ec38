"""LoRA keys (``actor_rollout_ref.model.lora_*``): verl's defaults, lists or 'all-linear', the engine's ``lora``
capability, and verl's LoRA-adjacent keys that are not built refused with the reason."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config

MODEL = "actor_rollout_ref.model"


def _issues(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return {issue.key: str(issue) for issue in info.value.issues}


def test_verl_defaults_and_accepted_values() -> None:
    model = load_config().actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules, model.exclude_modules) == (
        0,
        16,
        "all-linear",
        None,
    )
    assert (model.lora_adapter_path, model.use_shm, model.target_parameters, dict(model.lora)) == (
        None,
        False,
        None,
        {},
    )
    model = load_config(
        overrides=[f"{MODEL}.lora_rank=8", f"{MODEL}.lora_alpha=32", f"{MODEL}.target_modules=[q_proj,v_proj]"]
    ).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, list(model.target_modules)) == (8, 32, ["q_proj", "v_proj"])
    # verl's Megatron section at its default (rank 0) loads: nothing reads it there either.
    load_config(overrides=[f"{MODEL}.lora={{rank: 0, type: lora, merge: false}}"])


def test_lora_with_an_engine_without_the_capability_names_the_engine(fake_backends, plugin_kit) -> None:
    fake_backends.table["training_engine"]["megatron"] = plugin_kit.spec(
        "megatron", capabilities=frozenset({"data_parallel"})
    )
    issues = _issues([f"{MODEL}.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron"])
    assert "training engine 'megatron' cannot train LoRA adapters" in issues[f"{MODEL}.lora_rank"]
    load_config(overrides=[f"{MODEL}.lora_rank=8", "actor_rollout_ref.actor.strategy=fsdp"])


@pytest.mark.parametrize(
    ("override", "key", "reason"),
    [
        ("lora_rank=-1", "lora_rank", "must be >= 0"),
        ("lora_alpha=0", "lora_alpha", "must be > 0"),
        ("target_modules=[]", "target_modules", "non-empty list"),
        ("use_shm=true", "use_shm", "shared-memory loading"),
        ("target_parameters=[experts]", "target_parameters", "not built"),
        ("lora={rank: 16}", "lora.rank", "megatron engine here has no LoRA"),
    ],
)
def test_bad_values_are_refused_at_their_key(override: str, key: str, reason: str) -> None:
    issues = _issues([f"{MODEL}.lora_rank=8", f"{MODEL}.{override}"])
    assert reason in issues[f"{MODEL}.{key}"]


def test_adapter_path_needs_lora_on_and_critic_lora_is_refused() -> None:
    issues = _issues([f"{MODEL}.lora_adapter_path=/some/adapter", "critic.model.lora_rank=8"])
    assert "set actor_rollout_ref.model.lora_rank > 0" in issues[f"{MODEL}.lora_adapter_path"]
    assert "critic LoRA is not built" in issues["critic.model.lora_rank"]


def test_lora_merge_false_needs_a_rollout_that_serves_adapters() -> None:
    """verl's ``model.lora.merge=false`` (serve the adapter) with the hf rollout, which cannot: refused with the
    fix; ``true`` (merged weights) and unset load."""
    issues = _issues([f"{MODEL}.lora_rank=8", f"{MODEL}.lora={{merge: false}}", "actor_rollout_ref.rollout.name=hf"])
    assert "rollout engine 'hf' cannot serve adapters" in issues[f"{MODEL}.lora.merge"]
    assert "lora.merge=true" in issues[f"{MODEL}.lora.merge"]
    load_config(overrides=[f"{MODEL}.lora_rank=8", f"{MODEL}.lora={{merge: true}}"])
    issues = _issues([f"{MODEL}.lora_rank=8", f"{MODEL}.lora={{merge: maybe}}"])
    assert "must be true or false" in issues[f"{MODEL}.lora.merge"]


@pytest.mark.parametrize(
    ("rank", "lora", "capabilities", "placement", "device", "expected"),
    [
        (8, {}, {"lora_adapters"}, None, None, True),  # verl's default merge=false, on an engine that can
        (8, {}, {"lora_adapters"}, None, "cuda:0", True),
        (8, {}, {"lora_adapters"}, None, "cpu", False),  # unset on a CPU: merged (vLLM's CPU LoRA layers are slow)
        (8, {"merge": False}, {"lora_adapters"}, None, "cpu", True),  # asked for: served on a CPU too
        (8, {"merge": False}, {"lora_adapters"}, "hybrid", None, True),
        (8, {"merge": True}, {"lora_adapters"}, None, None, False),  # merged weights asked for
        (8, {}, {"tensor_parallel"}, None, None, False),  # the engine cannot serve adapters: merged
        (8, {}, {"lora_adapters"}, "standalone", None, False),  # a rollout pool of its own gets merged weights
        (0, {}, {"lora_adapters"}, None, None, False),  # no LoRA
    ],
)
def test_serves_lora_adapters_rule(rank, lora, capabilities, placement, device, expected) -> None:
    from types import SimpleNamespace

    from verl.config import serves_lora_adapters

    cfg = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(
            model=SimpleNamespace(lora_rank=rank, lora=lora),
            rollout=SimpleNamespace(placement=placement, nnodes=0),
        )
    )
    assert serves_lora_adapters(cfg, frozenset(capabilities), device) is expected
