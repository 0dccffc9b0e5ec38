"""verl's log-prob/entropy keys reach the engines from the config (with verl's defaults), and bad values fail
at load naming the key."""

from __future__ import annotations

import pytest

from verl.config import load_config
from verl.config.errors import ConfigError
from verl.engines.reference.builders import role_settings

FIELDS = (
    "use_torch_compile",
    "entropy_from_logits_with_chunking",
    "entropy_from_logits_chunk_size",
    "entropy_checkpointing",
    "use_fused_kernels",
    "fused_kernels_backend",
)


def _settings(*overrides: str) -> tuple:
    config = load_config(overrides=list(overrides))
    return role_settings(config, "actor")[0], role_settings(config, "ref")[0]


def test_defaults_are_verls():
    actor, ref = _settings()
    # verl: actor.use_torch_compile true, ref follows it; chunking/checkpointing/fused off; chunk 2048; torch
    for s in (actor, ref):
        assert [getattr(s, f) for f in FIELDS] == [True, False, 2048, False, False, "torch"]
    assert actor.enable_activation_offload is False


def test_actor_keys_reach_the_actor_and_ref_keys_the_ref():
    actor, ref = _settings(
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        "actor_rollout_ref.actor.entropy_from_logits_chunk_size=64",
        "actor_rollout_ref.actor.entropy_checkpointing=true",
        "actor_rollout_ref.ref.entropy_from_logits_with_chunking=true",
        "actor_rollout_ref.model.use_fused_kernels=true",
        "actor_rollout_ref.model.enable_activation_offload=true",
    )
    assert [getattr(actor, f) for f in FIELDS] == [False, True, 64, True, True, "torch"]
    assert actor.enable_activation_offload is True
    # ref.use_torch_compile null follows the actor (verl's oc.select); its own chunking key, the shared model key
    assert [getattr(ref, f) for f in FIELDS] == [False, True, 2048, False, True, "torch"]


def test_ref_use_torch_compile_overrides_the_actor():
    actor, ref = _settings("actor_rollout_ref.ref.use_torch_compile=false")
    assert actor.use_torch_compile is True and ref.use_torch_compile is False


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        ("actor_rollout_ref.model.fused_kernel_options.impl_backend=triton", "impl_backend", "only 'torch'"),
        ("actor_rollout_ref.actor.entropy_from_logits_chunk_size=0", "entropy_from_logits_chunk_size", ">= 1"),
        ("actor_rollout_ref.ref.entropy_from_logits_chunk_size=-3", "ref.entropy_from_logits_chunk_size", ">= 1"),
        ("data.filter_overlong_prompts_workers=0", "data.filter_overlong_prompts_workers", ">= 1"),
    ],
)
def test_bad_values_fail_at_load_naming_the_key(override, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert key in str(err.value) and words in str(err.value)
