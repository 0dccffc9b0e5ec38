"""verl's defaults and names for strategy / controller, model_engine, ref.strategy and fsdp2 (issue #15)."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config, resolve_config
from verl.config.resolve import get_path, replace_path
from verl.config.schema import RootConfig

ARR = "actor_rollout_ref"


@pytest.mark.parametrize(
    ("overrides", "strategy", "controller"),
    [
        ([], "reference", "local"),  # one worker: core's in-process engine, no Ray, no plugin
        (["trainer.n_gpus_per_node=8"], "fsdp", "ray"),  # verl's defaults for verl's usual 8 GPUs
        (["trainer.nnodes=2", "data.train_batch_size=1024"], "fsdp", "ray"),  # world 2 x 1
    ],
)
def test_null_strategy_and_controller_follow_the_world_size(overrides, strategy, controller) -> None:
    filled: dict[str, str] = {}
    cfg = load_config(overrides=overrides, filled=filled)
    arr = cfg.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy, cfg.critic.strategy) == (strategy, strategy, strategy)
    assert cfg.trainer.controller == controller
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    assert f"world {world} = trainer.nnodes" in filled[f"{ARR}.actor.strategy"]
    assert f"world {world} = trainer.nnodes" in filled["trainer.controller"]
    assert filled[f"{ARR}.ref.strategy"] == f"null: the actor's ({strategy})"


def test_a_separate_rollout_pool_makes_the_null_controller_ray() -> None:
    cfg = resolve_config(replace_path(RootConfig(), f"{ARR}.rollout.placement", "colocated"))
    assert cfg.trainer.controller == "ray"
    assert cfg.actor_rollout_ref.actor.strategy == "reference"  # still one trainer worker


def test_explicit_values_are_never_replaced() -> None:
    filled: dict[str, str] = {}
    cfg = load_config(overrides=["trainer.controller=ray", f"{ARR}.actor.strategy=reference"], filled=filled)
    assert (cfg.trainer.controller, cfg.actor_rollout_ref.actor.strategy) == ("ray", "reference")
    assert "trainer.controller" not in filled and f"{ARR}.actor.strategy" not in filled
    # An explicit single-process choice on 2 workers is an error, not silently switched to verl's default.
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["trainer.n_gpus_per_node=2", "trainer.controller=local"])
    assert any(issue.key == "trainer.controller" for issue in info.value.issues)
    with pytest.raises(ConfigError, match="runs in a single process"):
        load_config(overrides=["trainer.n_gpus_per_node=2", f"{ARR}.actor.strategy=reference"])


@pytest.mark.parametrize("key", [f"{ARR}.actor.strategy", f"{ARR}.ref.strategy", "critic.strategy"])
def test_fsdp2_is_verls_name_for_fsdp(key: str) -> None:
    cfg = load_config(overrides=[f"{key}=fsdp2", "algorithm.adv_estimator=gae"])
    assert get_path(cfg, key) == "fsdp"


def test_fsdp_config_follows_the_ref_strategy() -> None:
    cfg = load_config(
        overrides=[
            f"{ARR}.ref.strategy=fsdp2",
            f"{ARR}.ref.fsdp_config.param_offload=true",
            f"{ARR}.actor.use_kl_loss=true",
        ]
    )
    ref = cfg.actor_rollout_ref.ref
    assert (ref.strategy, ref.engine_kwargs) == ("fsdp", {"fsdp": {"param_offload": True}})
    assert cfg.actor_rollout_ref.actor.strategy == "reference"  # the actor keeps its own engine


def test_ref_strategy_is_checked_as_a_training_engine() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ARR}.ref.strategy=bogus"])
    assert [issue.key for issue in info.value.issues] == [f"{ARR}.ref.strategy"]
    assert "unknown training engine 'bogus'" in str(info.value)


def test_model_engine_names_the_null_strategy_and_refuses_another_family() -> None:
    cfg = resolve_config(replace_path(RootConfig(), "model_engine", "megatron"))
    arr = cfg.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy, cfg.critic.strategy) == ("megatron", "megatron", "megatron")
    # megatron is not installed: the error is the plugin lookup's, with its install hint.
    with pytest.raises(ConfigError, match=r"unknown training engine 'megatron'"):
        load_config(overrides=["model_engine=megatron"])
    with pytest.raises(ConfigError, match=r"model_engine=megatron selects the megatron engine"):
        load_config(overrides=["model_engine=megatron", f"{ARR}.actor.strategy=fsdp"])
    assert load_config(overrides=["model_engine=dp"]).actor_rollout_ref.actor.strategy == "reference"
    with pytest.raises(ConfigError, match="model_engine"):
        load_config(overrides=["model_engine=tpu"])


def test_config_show_prints_the_resolved_value_and_why(capsys) -> None:
    from verl.cli.main import main as verl_main

    assert verl_main(["config", "show", "--schema-defaults", "trainer.n_gpus_per_node=8"]) == 0
    out = capsys.readouterr().out
    assert "#   trainer.controller: ray  (null: world 8 = trainer.nnodes 1 x trainer.n_gpus_per_node 8 > 1" in out
    assert f"#   {ARR}.actor.strategy: fsdp  (null: world 8" in out
