"""verl's ``fsdp_config`` sections are accepted and land in ``engine_kwargs.fsdp`` (checked by the plugin)."""

from __future__ import annotations

import attrs
import pytest

from verl.config import ConfigError, load_config

ACTOR = "actor_rollout_ref.actor"
FSDP = [f"{ACTOR}.strategy=fsdp"]


def test_actor_fsdp_config_override_is_the_engine_kwargs_option() -> None:
    cfg = load_config(overrides=[*FSDP, f"{ACTOR}.fsdp_config.param_offload=true", f"{ACTOR}.fsdp_config.fsdp_size=2"])
    assert dict(cfg.actor_rollout_ref.actor.engine_kwargs["fsdp"]) == {"param_offload": True, "fsdp_size": 2}


def test_ref_and_critic_fsdp_config(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "actor_rollout_ref:\n"
        "  actor: {strategy: fsdp}\n"
        "  ref:\n"
        "    fsdp_config: {param_offload: true}\n"
        "critic:\n"
        "  fsdp_config: {fsdp_size: 2}\n"
        "algorithm: {adv_estimator: gae}\n"
    )
    cfg = load_config(path)
    assert dict(cfg.actor_rollout_ref.ref.engine_kwargs["fsdp"]) == {"param_offload": True}
    assert dict(cfg.critic.engine_kwargs["fsdp"]) == {"fsdp_size": 2}
    assert "fsdp_config" not in str(cfg.actor_rollout_ref.actor.engine_kwargs)


def test_same_option_under_both_names_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            overrides=[
                *FSDP,
                f"{ACTOR}.fsdp_config.param_offload=true",
                f"{ACTOR}.engine_kwargs.fsdp.param_offload=false",
            ]
        )
    assert f"{ACTOR}.fsdp_config.param_offload is also set as {ACTOR}.engine_kwargs.fsdp.param_offload" in str(
        err.value
    )


def test_unknown_fsdp_config_option_is_reported_by_the_plugin_options_class() -> None:
    # The fake plugin table of these tests gives fsdp an options class without `bogus_knob`.
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*FSDP, f"{ACTOR}.fsdp_config.bogus_knob=1"])
    assert "bogus_knob" in str(err.value)


def test_fsdp_config_must_be_a_section() -> None:
    with pytest.raises(ConfigError, match="must be a section of options"):
        load_config(overrides=[*FSDP, f"{ACTOR}.fsdp_config=3"])


@pytest.mark.parametrize(
    ("model_engine", "nnodes", "per_node", "expected"),
    [("dp", 1, 1, "reference"), ("dp", 1, 2, "fsdp"), ("dp", 2, 1, "fsdp"), ("megatron", 1, 1, "megatron")],
)
def test_raw_tree_and_resolved_config_pick_the_same_null_strategy(model_engine, nnodes, per_node, expected) -> None:
    from types import SimpleNamespace

    from verl.config.aliases import _default_strategy
    from verl.config.resolve import default_strategy, strategy_for

    raw = {"model_engine": model_engine, "trainer": {"nnodes": nnodes, "n_gpus_per_node": per_node}}
    cfg = SimpleNamespace(model_engine=model_engine, trainer=SimpleNamespace(nnodes=nnodes, n_gpus_per_node=per_node))
    assert strategy_for(model_engine, nnodes, per_node) == expected
    assert _default_strategy(raw) == expected and default_strategy(cfg) == expected


def test_raw_tree_with_a_bad_world_counts_one_process() -> None:
    from verl.config.aliases import _default_strategy

    # The wrong type is the schema check's error; the alias step must not fail first.
    assert _default_strategy({"trainer": {"nnodes": "two", "n_gpus_per_node": 4}}) == "reference"


# ----------------------------------------------------------------------------- verl's megatron sections


@attrs.frozen(kw_only=True)
class _MegatronOptions:  # the fake plugin table's stand-in for verl-megatron's options class
    tensor_model_parallel_size: int = 1
    param_offload: bool = False
    seed: int = 42


@pytest.fixture
def megatron_engine(fake_backends, plugin_kit):
    table = fake_backends.table["training_engine"]
    table["megatron"] = plugin_kit.spec("megatron", _MegatronOptions, capabilities=frozenset({"data_parallel"}))
    return table["megatron"]


MEGATRON = [f"{ACTOR}.strategy=megatron"]


def test_actor_megatron_section_is_the_engine_kwargs_option(megatron_engine) -> None:
    cfg = load_config(overrides=[*MEGATRON, f"{ACTOR}.megatron.tensor_model_parallel_size=2"])
    assert dict(cfg.actor_rollout_ref.actor.engine_kwargs) == {"megatron": {"tensor_model_parallel_size": 2}}


def test_ref_and_critic_megatron_sections_follow_the_actor_engine(megatron_engine, tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "actor_rollout_ref:\n"
        "  actor: {strategy: megatron, megatron: {seed: 7}}\n"
        "  ref:\n"
        "    megatron: {param_offload: true}\n"
        "critic:\n"
        "  megatron: {tensor_model_parallel_size: 2}\n"
        "algorithm: {adv_estimator: gae}\n"
    )
    cfg = load_config(path)
    assert dict(cfg.actor_rollout_ref.actor.engine_kwargs) == {"megatron": {"seed": 7}}
    assert dict(cfg.actor_rollout_ref.ref.engine_kwargs) == {"megatron": {"param_offload": True}}
    assert dict(cfg.critic.engine_kwargs) == {"megatron": {"tensor_model_parallel_size": 2}}


def test_model_engine_megatron_takes_the_megatron_section(megatron_engine) -> None:
    # A null strategy under verl's model_engine=megatron is the megatron engine (verl.config.resolve).
    cfg = load_config(overrides=["model_engine=megatron", f"{ACTOR}.megatron.param_offload=true"])
    assert dict(cfg.actor_rollout_ref.actor.engine_kwargs) == {"megatron": {"param_offload": True}}


@pytest.mark.parametrize("strategy", ["fsdp", "reference"])
def test_megatron_section_with_another_engine_names_the_engine_and_the_key(megatron_engine, strategy) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{ACTOR}.strategy={strategy}", f"{ACTOR}.megatron.tensor_model_parallel_size=2"])
    (issue,) = err.value.issues
    assert issue.key == f"{ACTOR}.megatron.tensor_model_parallel_size"
    assert issue.message == (
        f"{ACTOR}.megatron.tensor_model_parallel_size: {ACTOR}.megatron configures Megatron, but the training engine "
        f"is {strategy!r} ({ACTOR}.strategy); set {ACTOR}.strategy=megatron, or configure {strategy!r} under "
        f"{ACTOR}.engine_kwargs.{strategy}"
    )


def test_ref_megatron_section_with_a_ref_of_another_engine_names_the_ref_strategy(megatron_engine) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            overrides=[*MEGATRON, "actor_rollout_ref.ref.strategy=fsdp", "actor_rollout_ref.ref.megatron.seed=1"]
        )
    (issue,) = err.value.issues
    assert issue.key == "actor_rollout_ref.ref.megatron.seed"
    assert "set actor_rollout_ref.ref.strategy=megatron" in issue.message


def test_megatron_option_under_both_names_is_an_error(megatron_engine) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*MEGATRON, f"{ACTOR}.megatron.seed=1", f"{ACTOR}.engine_kwargs.megatron.seed=2"])
    assert f"{ACTOR}.megatron.seed is also set as {ACTOR}.engine_kwargs.megatron.seed; keep one of them" in str(
        err.value
    )


def test_fsdp_config_with_the_megatron_engine_says_where_megatron_options_go(megatron_engine) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*MEGATRON, f"{ACTOR}.fsdp_config.param_offload=true"])
    (issue,) = err.value.issues
    assert "configures FSDP, but the training engine is 'megatron'" in issue.message
    assert f"set {ACTOR}.strategy=fsdp, or configure 'megatron' under {ACTOR}.engine_kwargs.megatron" in issue.message
