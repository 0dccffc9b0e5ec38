"""verl's ``fsdp_config`` sections land where the role's training engine reads them (issue #15).

With ``strategy=reference`` (core's single-process engine, our default) ``param_offload`` /
``optimizer_offload`` / ``model_dtype`` become its options; any other FSDP key is an error naming the engine,
never a section nobody reads.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from verl.config import ConfigError, load_config, role_options
from verl.engines.reference.builders import ReferenceEngineOptions

A = "actor_rollout_ref.actor"
SPEC = SimpleNamespace(options_cls=ReferenceEngineOptions)  # what role_options reads of the reference spec


def _options(cfg, role):
    return role_options(cfg, role, SPEC)


REF = "actor_rollout_ref.ref"


@pytest.fixture(autouse=True)
def reference_options(fake_backends):
    """The fake reference spec with the real engine's options class (the fake table has none)."""
    fake_backends.table["training_engine"]["reference"].options_cls = ReferenceEngineOptions


def test_reference_engine_takes_offload_and_dtype() -> None:
    cfg = load_config(
        overrides=[
            f"{A}.fsdp_config.param_offload=True",
            f"{A}.fsdp_config.optimizer_offload=True",
            f"{A}.fsdp_config.model_dtype=bf16",
            f"{REF}.fsdp_config.param_offload=False",
        ]
    )
    arr = cfg.actor_rollout_ref
    assert dict(arr.actor.engine_kwargs["reference"]) == {
        "param_offload": True,
        "optimizer_offload": True,
        "dtype": "bfloat16",
    }
    assert "fsdp" not in arr.actor.engine_kwargs
    # The builder gives the ref role its own override on top of the actor's options.
    assert _options(cfg, "ref").param_offload is False
    assert _options(cfg, "actor").param_offload is True
    assert _options(cfg, "ref").optimizer_offload is True


def test_fsdp_only_key_with_the_reference_engine_names_it() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{A}.fsdp_config.use_orig_params=True"])
    message = str(err.value)
    assert f"{A}.fsdp_config.use_orig_params" in message
    assert "training engine 'reference'" in message and f"{A}.strategy=fsdp" in message


def test_critic_follows_its_own_strategy() -> None:
    cfg = load_config(
        overrides=[
            "algorithm.adv_estimator=gae",
            f"{A}.strategy=fsdp",
            "critic.strategy=reference",
            "critic.fsdp_config.param_offload=True",
        ]
    )
    assert dict(cfg.critic.engine_kwargs["reference"]) == {"param_offload": True}


def test_fsdp_config_under_another_engine_is_an_error() -> None:
    with pytest.raises(ConfigError, match="configures FSDP, but the training engine is 'megatron'"):
        load_config(overrides=[f"{A}.strategy=megatron", f"{A}.fsdp_config.param_offload=True"])


def test_ref_options_without_actor_ones() -> None:
    cfg = load_config(overrides=[f"{REF}.engine_kwargs.reference.param_offload=True"])
    assert _options(cfg, "ref").param_offload is True
    assert _options(cfg, "actor").param_offload is False
