"""DAPO's dynamic-sampling keys: ``algorithm.filter_groups.*`` and ``data.gen_batch_size`` (issue #20); their
verl defaults are pinned in ``test_config_defaults.py``."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config

FG = "algorithm.filter_groups"
BASE = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4"]
BASE += ["actor_rollout_ref.actor.ppo_mini_batch_size=4"]


def load(*overrides: str):
    warnings: list[str] = []
    cfg = load_config(None, [*BASE, *overrides], on_warning=warnings.append)
    return cfg, warnings


def keys(error: ConfigError) -> list[str]:
    return [issue.key for issue in error.issues]


def test_dapo_recipe_settings_load():
    cfg, warnings = load(
        f"{FG}.enable=true", f"{FG}.metric=acc", f"{FG}.max_num_gen_batches=10", "data.gen_batch_size=12"
    )
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches, cfg.data.gen_batch_size) == (True, "acc", 10, 12)
    assert not [w for w in warnings if FG in w]
    # Fewer prompts per round than per step is allowed: the step runs as many rounds as it needs.
    assert load(f"{FG}.enable=true", f"{FG}.metric=seq_reward", "data.gen_batch_size=2")[0].data.gen_batch_size == 2


@pytest.mark.parametrize("metric", ["null", "''", "'  '"])
def test_enable_without_a_metric_is_an_error_naming_the_key(metric):
    with pytest.raises(ConfigError) as info:
        load(f"{FG}.enable=true", f"{FG}.metric={metric}")
    assert keys(info.value) == [f"{FG}.metric"]
    assert "acc, score, seq_reward, seq_final_reward" in str(info.value)


@pytest.mark.parametrize("gen", [2, 8])
def test_gen_batch_size_other_than_train_batch_size_without_filtering_is_refused(gen):
    with pytest.raises(ConfigError) as info:
        load(f"data.gen_batch_size={gen}")
    assert keys(info.value) == ["data.gen_batch_size"]
    message = str(info.value)
    assert f"({gen}) differs from data.train_batch_size (4)" in message
    assert "data.gen_batch_size=null" in message and f"{FG}.enable" in message


def test_gen_batch_size_equal_to_train_batch_size_or_null_needs_no_filtering():
    assert load("data.gen_batch_size=4")[0].data.gen_batch_size == 4
    assert load("data.gen_batch_size=null")[0].data.gen_batch_size is None


@pytest.mark.parametrize("gen", [0, -3])
def test_gen_batch_size_must_be_positive(gen):
    with pytest.raises(ConfigError) as info:
        load(f"{FG}.enable=true", f"{FG}.metric=acc", f"data.gen_batch_size={gen}")
    assert keys(info.value) == ["data.gen_batch_size"]
    assert f"must be >= 1 (prompts per generation round) or null (= train_batch_size), got {gen}" in str(info.value)


def test_one_response_per_prompt_warns_that_nothing_is_filtered():
    _, warnings = load(f"{FG}.enable=true", f"{FG}.metric=acc", "actor_rollout_ref.rollout.n=1")
    (warning,) = [w for w in warnings if w.startswith(f"{FG}.enable")]
    assert "rollout.n=1" in warning and "groups of one are kept" in warning


def test_filter_keys_without_enable_warn_they_are_unread():
    _, warnings = load(f"{FG}.metric=acc")
    assert any(w.startswith(f"{FG}.enable: is false") for w in warnings)
    _, warnings = load()
    assert not [w for w in warnings if FG in w]


def test_a_compute_score_metric_with_a_replacing_reward_model_is_refused():
    rm = ["reward_model.enable=true", "reward_model.model.path=/models/rm"]
    with pytest.raises(ConfigError) as info:
        load(f"{FG}.enable=true", f"{FG}.metric=acc", *rm)
    assert keys(info.value) == [f"{FG}.metric"]
    assert "combine=replace" in str(info.value)
    # The reward tensors' sums exist with a reward model; with combine=sum compute_score runs too.
    assert load(f"{FG}.enable=true", f"{FG}.metric=seq_reward", *rm)[0].reward_model.enable
    assert load(f"{FG}.enable=true", f"{FG}.metric=acc", *rm, "reward_model.combine=sum")[0].reward_model.enable


def test_unknown_filter_groups_key_gets_a_spelling_hint():
    with pytest.raises(ConfigError, match="max_num_gen_batches"):
        load(f"{FG}.max_num_gen_batch=3")
