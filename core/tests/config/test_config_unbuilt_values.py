"""Values of verl keys that are not built are refused at load time with the alternative (issue #15)."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config


def _error(*overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=list(overrides))
    return str(info.value)


@pytest.mark.parametrize(
    "override,key,hint",
    [
        ("reward_model.reward_manager=batch", "reward_model.reward_manager", "custom_reward_function"),
        ("reward_model.reward_manager=prime", "reward_model.reward_manager", "isolation=process"),
        ("reward_model.reward_manager=nave", "reward_model.reward_manager", "built: ['naive', 'dapo']"),
        ("actor_rollout_ref.actor.optim.total_training_steps=100", "actor.optim.total_training_steps", "trainer.total"),
        ("critic.optim.total_training_steps=100", "critic.optim.total_training_steps", "trainer.total_training_steps"),
        (
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
            "actor.checkpoint.save_contents",
            "verl export",
        ),
        ("critic.checkpoint.load_contents=[model]", "critic.checkpoint.load_contents", "exact resume"),
        (
            "+reward_model.reward_kwargs.max_resp_len=64",
            "reward_model.reward_kwargs.max_resp_len",
            "reward_manager=dapo",
        ),
    ],
)
def test_unbuilt_value_is_refused_with_the_key_and_the_alternative(override, key, hint):
    message = _error(override)
    assert key in message and hint in message


def test_dapo_overlong_buffer_conditions_are_verls():
    base = ["reward_model.reward_manager=dapo"]
    assert "max_resp_len" in _error(*base, "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 4}")
    message = _error(
        *base,
        "+reward_model.reward_kwargs.max_resp_len=8",
        "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 16}",
    )
    assert "overlong_buffer_cfg.len" in message and "<= max_resp_len=8" in message
    assert "unknown keys ['lenght']" in _error(*base, "+reward_model.reward_kwargs.overlong_buffer_cfg={lenght: 4}")


@pytest.mark.parametrize(
    "override,key,hint",
    [
        ("+reward_model.reward_kwargs.max_resp_len=abc", "reward_model.reward_kwargs.max_resp_len='abc'", "an int"),
        ("+reward_model.reward_kwargs.max_resp_len=true", "reward_model.reward_kwargs.max_resp_len=True", "an int"),
        (
            "+reward_model.reward_kwargs={max_resp_len: abc, overlong_buffer_cfg: {enable: true, len: 4}}",
            "reward_model.reward_kwargs.max_resp_len='abc'",
            "an int",
        ),
        (
            "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: '4'}",
            "reward_model.reward_kwargs.overlong_buffer_cfg.len='4'",
            "an int",
        ),
        (
            "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: yes please}",
            "reward_model.reward_kwargs.overlong_buffer_cfg.enable='yes please'",
            "true or false",
        ),
        (
            "+reward_model.reward_kwargs.overlong_buffer_cfg={penalty_factor: big}",
            "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor='big'",
            "a number",
        ),
    ],
)
def test_dapo_kwargs_of_the_wrong_type_are_config_errors_naming_the_key(override, key, hint):
    message = _error("reward_model.reward_manager=dapo", override)
    assert key in message and hint in message


def test_the_built_values_load():
    cfg = load_config(
        overrides=[
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.max_resp_len=512",
            "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 128, penalty_factor: 1.0, log: true}",
            "actor_rollout_ref.actor.checkpoint.save_contents=[extra,model,optimizer]",
            "actor_rollout_ref.actor.checkpoint.load_contents=[model,optimizer,extra]",
        ]
    )
    assert cfg.reward_model.reward_manager == "dapo"
