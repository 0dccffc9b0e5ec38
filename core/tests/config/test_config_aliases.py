"""verl's ``fsdp_config`` sections are accepted and land in ``engine_kwargs.fsdp`` (checked by the plugin)."""

from __future__ import annotations

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
