"""Loading: YAML file + dotted overrides, unknown keys (K21), wrong types, YAML 1.2 typing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from verl.config import ConfigError, load_config


def _write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- K21
def test_k21_misspelled_overrides_fail_with_full_key_and_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["algorithm.kl_ctrl.kl_coeff=0.5", "+actor_rollout_ref.actor.ppo_epoch=4"])
    text = str(info.value)
    assert "'algorithm.kl_ctrl.kl_coeff'" in text
    assert "did you mean 'algorithm.kl_ctrl.kl_coef'" in text.lower()
    assert "'actor_rollout_ref.actor.ppo_epoch'" in text
    assert "did you mean 'actor_rollout_ref.actor.ppo_epochs'" in text.lower()
    assert {issue.key for issue in info.value.issues} == {
        "algorithm.kl_ctrl.kl_coeff",
        "actor_rollout_ref.actor.ppo_epoch",
    }


def test_k21_correct_spellings_take_effect() -> None:
    cfg = load_config(overrides=["algorithm.kl_ctrl.kl_coef=0.5", "+actor_rollout_ref.actor.ppo_epochs=4"])
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.5
    assert cfg.actor_rollout_ref.actor.ppo_epochs == 4


def test_k21_rollout_key_under_actor_in_yaml_points_to_the_right_section(tmp_path: Path) -> None:
    path = _write(tmp_path, "actor_rollout_ref:\n  actor:\n    temperature: 0.7\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert info.value.key == "actor_rollout_ref.actor.temperature"
    assert "'actor_rollout_ref.actor.temperature'" in text
    assert "'actor_rollout_ref.rollout.temperature'" in text
    assert str(path) in text  # where it was set


def test_k21_yaml_typo_is_not_dropped_silently(tmp_path: Path) -> None:
    path = _write(tmp_path, "algorithm:\n  kl_ctrl:\n    kl_coeff: 0.5\n")
    with pytest.raises(ConfigError, match=r"algorithm\.kl_ctrl\.kl_coeff.*kl_coef"):
        load_config(path)


def test_unknown_section_suggests_the_close_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown config section 'rewrd_model'.*'reward_model'"):
        load_config(overrides=["rewrd_model.reward_manager=naive"])


def test_unknown_key_of_verls_reward_section_names_ours() -> None:
    # reward.reward_manager is a section in verl (name, source, module): the scalar form is a mistake.
    with pytest.raises(ConfigError, match=r"'reward.reward_manager'.*did you mean 'reward_model.reward_manager'"):
        load_config(overrides=["reward.reward_manager=naive"])


def test_backend_option_at_section_level_points_to_engine_kwargs() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.swap_space=4"])
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space" in str(info.value)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["trainer.nodes=2", "data.train_batch_size=many", "algorithm.lamda=0.9"])
    assert [i.key for i in info.value.issues] == ["algorithm.lamda", "trainer.nodes", "data.train_batch_size"]
    assert str(info.value).startswith("3 config errors:")


# ---------------------------------------------------------------- wrong types
@pytest.mark.parametrize(
    "override,key,expected,received",
    [
        ("actor_rollout_ref.rollout.n=four", "actor_rollout_ref.rollout.n", "expected int", "'four' (str)"),
        ("trainer.nnodes=true", "trainer.nnodes", "expected int", "True (bool)"),
        ("data.train_batch_size=8.5", "data.train_batch_size", "expected int", "8.5 (float)"),
        ("data.shuffle=maybe", "data.shuffle", "expected bool", "'maybe' (str)"),
        ("data.shuffle=1", "data.shuffle", "expected bool", "1 (int)"),
        ("actor_rollout_ref.actor.optim.lr=fast", "actor_rollout_ref.actor.optim.lr", "expected float", "'fast'"),
        ("trainer.project_name=[a,b]", "trainer.project_name", "expected str", "['a', 'b'] (list)"),
        ("trainer.logger=[console,wandbb]", "trainer.logger[1]", "one of 'console', 'tensorboard', 'file'", "'wandbb'"),
        ("data.truncation=both", "data.truncation", "one of 'error', 'left', 'right', 'middle'", "'both'"),
        ("actor_rollout_ref.rollout=5", "actor_rollout_ref.rollout", "expected mapping", "5 (int)"),
        ("actor_rollout_ref.model.override_config=3", "actor_rollout_ref.model.override_config", "mapping", "3"),
        (
            "actor_rollout_ref.rollout.engine_kwargs.vllm=3",
            "actor_rollout_ref.rollout.engine_kwargs.vllm",
            "mapping",
            "3 (int)",
        ),
        ("actor_rollout_ref.actor.optim.betas=[0.9]", "actor_rollout_ref.actor.optim.betas", "list of 2", "[0.9]"),
    ],
)
def test_wrong_type_names_key_expected_type_and_value(override: str, key: str, expected: str, received: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert info.value.key == key
    text = str(info.value)
    assert text.startswith(key + ":")
    assert expected in text and received in text
    assert f"from override '{override}'" in text


def test_wrong_type_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "data:\n  max_prompt_length: long\n")
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length: expected int, got 'long'.*run\.yaml"):
        load_config(path)


def test_lossless_conversions_are_accepted() -> None:
    cfg = load_config(overrides=["algorithm.gamma=1", "trainer.experiment_name=2024", "data.train_files=a.parquet"])
    assert cfg.algorithm.gamma == 1.0 and isinstance(cfg.algorithm.gamma, float)
    assert cfg.trainer.experiment_name == "2024"
    assert cfg.data.train_files == ("a.parquet",)


# ---------------------------------------------------------------- override syntax and typing
def test_override_values_use_yaml_scalar_typing() -> None:
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "critic.optim.lr=3.0e-5",
            "data.val_files=null",
            "trainer.logger=[console,tensorboard]",
            "++trainer.total_training_steps=12",
            "actor_rollout_ref.rollout.do_sample=false",
            "actor_rollout_ref.rollout.temperature=0",
            "data.train_files=[a.parquet, b.parquet]",
            "trainer.project_name='017'",
        ]
    )
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert math.isclose(cfg.critic.optim.lr, 3e-5)
    assert cfg.data.val_files is None
    assert cfg.trainer.logger == ("console", "tensorboard")
    assert cfg.trainer.total_training_steps == 12
    assert cfg.actor_rollout_ref.rollout.do_sample is False
    assert cfg.data.train_files == ("a.parquet", "b.parquet")
    assert cfg.trainer.project_name == "017"


def test_later_overrides_win_and_overrides_beat_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "data:\n  train_batch_size: 64\n  max_prompt_length: 128\n")
    cfg = load_config(path, ["data.train_batch_size=32", "data.train_batch_size=512"])
    assert cfg.data.train_batch_size == 512
    assert cfg.data.max_prompt_length == 128
    assert cfg.data.max_response_length == 512  # untouched default


def test_free_form_dicts_take_new_keys_and_merge() -> None:
    cfg = load_config(
        overrides=[
            "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
            "actor_rollout_ref.model.override_config.rope_scaling={type: linear, factor: 2.0}",
            "+reward_model.reward_kwargs.method=flexible",
            "ray_kwargs.ray_init.num_cpus=2",
        ]
    )
    assert cfg.actor_rollout_ref.model.override_config == {
        "attention_dropout": 0.1,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    assert cfg.reward_model.reward_kwargs == {"method": "flexible"}
    assert cfg.ray_kwargs.ray_init == {"num_cpus": 2}


def test_mapping_override_merges_into_a_section() -> None:
    cfg = load_config(overrides=["actor_rollout_ref.rollout.val_kwargs={temperature: 0.6, do_sample: true}"])
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    assert (val.temperature, val.do_sample, val.top_p, val.n) == (0.6, True, 1.0, 1)


@pytest.mark.parametrize(
    "override,needle",
    [
        ("data.train_batch_size", "not of the form key=value"),
        ("=3", "not of the form key=value"),
        ("~trainer.logger", "deleting a key is not supported"),
        ("data..shuffle=true", "not a dotted key"),
        ("data.train_batch_size.extra=1", "'data.train_batch_size' is 1024 (int), not a section"),
    ],
)
def test_bad_override_syntax(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert needle in str(info.value)


# ---------------------------------------------------------------- YAML files
def test_yaml_file_values_merge_onto_defaults(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
data:
  train_batch_size: 16
  train_files: data/train.parquet
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 8
    optim:
      lr: 1e-5
  rollout:
    n: 4
algorithm:
  adv_estimator: grpo
critic:
""",
    )
    cfg = load_config(path)
    assert cfg.data.train_batch_size == 16 and cfg.data.train_files == ("data/train.parquet",)
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-5
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == 0.01  # sibling default kept
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.critic.enable is False  # "critic:" with nothing below keeps the defaults


def test_empty_yaml_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "")) == load_config()


def test_hydra_target_keys_are_ignored(tmp_path: Path) -> None:
    path = _write(tmp_path, "algorithm:\n  _target_: verl.trainer.config.AlgoConfig\n  gamma: 0.99\n")
    assert load_config(path).algorithm.gamma == 0.99


@pytest.mark.parametrize(
    "text,needle",
    [
        ("data: [1, 2\n", "is not valid YAML"),
        ("- a\n- b\n", "must hold a mapping"),
        ("defaults:\n  - ppo_trainer\n  - override model_engine: megatron\n", "selects a Hydra config group"),
        ("actor_rollout_ref:\n  rollout:\n    prompt_length: ${data.max_prompt_length}\n", "interpolation"),
    ],
)
def test_bad_yaml_files(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text))
    assert needle in str(info.value)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(missing)


def test_config_error_is_a_value_error_and_pickles() -> None:
    import pickle

    with pytest.raises(ValueError) as info:
        load_config(overrides=["trainer.nodes=1"])
    error = info.value
    assert isinstance(error, ConfigError)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.key == error.key == "trainer.nodes"


def test_multi_line_issues_stay_under_their_bullet() -> None:
    from verl.config import ConfigIssue

    error = ConfigError([ConfigIssue("a", "a: first\nsecond line"), ConfigIssue("b", "b: other")])
    assert str(error) == "2 config errors:\n  - a: first\n    second line\n  - b: other"
