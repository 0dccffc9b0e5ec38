"""to_dict / to_yaml / save_resolved_config round trips, and YAML 1.2 scalar typing."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from verl.config import (
    CONFIG_FILENAME,
    ConfigError,
    load_config,
    replace_path,
    save_resolved_config,
    to_dict,
    to_yaml,
)
from verl.config.yaml_io import dump_yaml, load_yaml, parse_scalar

TRICKY_OVERRIDES = [
    "trainer.project_name='1e-6'",  # a string that YAML 1.2 would read as a float
    "trainer.experiment_name='true'",
    "data.prompt_key='017'",
    "data.reward_fn_key='null'",
    "custom_reward_function.name=''",
    "actor_rollout_ref.actor.optim.lr=1e-7",
    "trainer.logger=[console,file]",
    "data.train_files=[a.parquet,b.parquet]",
    "+actor_rollout_ref.model.override_config.rope_scaling={type: linear, factor: 2.0}",
    "+reward_model.reward_kwargs.format_score=0.1",
    "ray_kwargs.ray_init.num_cpus=2",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_memory_utilization=0.4",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.device=cpu",
]


def _tricky_config():
    overrides = [o for o in TRICKY_OVERRIDES if not o.startswith("custom_reward_function")]
    return load_config(overrides=overrides)


@pytest.mark.parametrize("make", [load_config, _tricky_config], ids=["defaults", "tricky"])
def test_yaml_round_trip(tmp_path: Path, make) -> None:
    cfg = make()
    path = tmp_path / "dumped.yaml"
    path.write_text(to_yaml(cfg), encoding="utf-8")
    assert load_config(path) == cfg


def test_tricky_values_survive_as_their_types() -> None:
    cfg = _tricky_config()
    again = load_yaml(to_yaml(cfg))
    assert again["trainer"]["project_name"] == "1e-6"
    assert again["trainer"]["experiment_name"] == "true"
    assert again["data"]["prompt_key"] == "017"
    assert again["data"]["reward_fn_key"] == "null"
    assert again["actor_rollout_ref"]["actor"]["optim"]["lr"] == 1e-7


def test_to_dict_is_plain_data() -> None:
    tree = to_dict(_tricky_config())

    def check(node: object) -> None:
        assert isinstance(node, (dict, list, str, int, float, bool, type(None))), type(node)
        if isinstance(node, dict):
            for key, value in node.items():
                assert isinstance(key, str)
                check(value)
        elif isinstance(node, list):
            for value in node:
                check(value)

    check(tree)
    assert tree["trainer"]["logger"] == ["console", "file"]
    assert list(tree) == [
        "data",
        "actor_rollout_ref",
        "critic",
        "reward_model",
        "custom_reward_function",
        "algorithm",
        "trainer",
        "ray_kwargs",
        "model_engine",
        "async_training",
    ]


def test_save_resolved_config(tmp_path: Path) -> None:
    cfg = _tricky_config()
    run_dir = tmp_path / "runs" / "r1"
    written = save_resolved_config(cfg, run_dir)
    assert written == run_dir / CONFIG_FILENAME == run_dir / "config.yaml"
    assert load_config(written) == cfg
    save_resolved_config(load_config(), run_dir)  # overwrite
    assert load_config(written) == load_config()
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]  # no temp files left


def test_unwritable_free_form_value_is_a_config_error() -> None:
    cfg = replace_path(load_config(), "actor_rollout_ref.model.override_config", {"fn": object()})
    with pytest.raises(ConfigError, match="cannot be written as YAML"):
        to_yaml(cfg)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("4", 4),
        ("-3", -3),
        ("017", 17),  # YAML 1.1 would say octal 15
        ("0x1f", 31),
        ("1e-6", 1e-6),  # PyYAML alone would say the string "1e-6"
        ("1.5", 1.5),
        ("1E3", 1000.0),
        (".5", 0.5),
        ("true", True),
        ("False", False),
        ("yes", "yes"),  # YAML 1.1 would say True
        ("off", "off"),
        ("null", None),
        ("~", None),
        ("", ""),  # Hydra: empty value = empty string
        ("1:30", "1:30"),  # YAML 1.1 would say 90
        ("2024-01-01", "2024-01-01"),  # YAML 1.1 would say a date
        ("[a,b]", ["a", "b"]),
        ("[1, 2.5, x]", [1, 2.5, "x"]),
        ("{a: 1}", {"a": 1}),
        ("'4'", "4"),
        ("/data/x:y.parquet", "/data/x:y.parquet"),
        ("[unclosed", "[unclosed"),  # not YAML: kept as text
    ],
)
def test_parse_scalar(text: str, expected: object) -> None:
    value = parse_scalar(text)
    assert value == expected and type(value) is type(expected)


def test_special_floats_round_trip() -> None:
    data = {"a": float("inf"), "b": -float("inf"), "c": 1e-12, "d": "1e-12", "e": ".inf"}
    back = load_yaml(dump_yaml(data))
    assert back["a"] == math.inf and back["b"] == -math.inf and back["c"] == 1e-12
    assert back["d"] == "1e-12" and back["e"] == ".inf"
    assert math.isnan(load_yaml(dump_yaml({"n": float("nan")}))["n"])
