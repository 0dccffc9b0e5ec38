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
