"""Tracker names in the config, missing-library errors, and the value conversions every backend shares."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.config import ConfigError, load_config
from verl.config.schema import TrainerConfig
from verl.config.schema.trainer import UNSHIPPED_LOGGERS, Logger
from verl.trainer.trackers import OPTIONAL_BACKENDS, TrackingBackendError
from verl.trainer.trackers.clearml_backend import split_key
from verl.trainer.trackers.mlflow_backend import sanitize_metric_key
from verl.trainer.trackers.values import flatten_params, scalars
from verl.trainer.tracking import METRICS_FILE, VALID_BACKENDS, Tracking

# verl/utils/tracking.py:Tracking.supported_backend
VERL_BACKENDS = {
    "wandb",
    "mlflow",
    "swanlab",
    "vemlp_wandb",
    "tensorboard",
    "console",
    "clearml",
    "trackio",
    "file",
    "rl_insight",
}


def test_schema_knows_every_verl_logger_and_ships_the_tracking_ones() -> None:
    import typing

    names = set(typing.get_args(Logger))
    assert names == VERL_BACKENDS | {"tracking"}
    assert set(VALID_BACKENDS) == names - set(UNSHIPPED_LOGGERS)
    assert set(OPTIONAL_BACKENDS) == {"wandb", "mlflow", "swanlab", "clearml"}


def test_console_wandb_loads_as_in_verl() -> None:
    cfg = load_config(overrides=["trainer.logger=[console,wandb]"])
    assert cfg.trainer.logger == ("console", "wandb")
    cfg = load_config(overrides=["trainer.logger=[mlflow,swanlab,clearml,file]"])
    assert cfg.trainer.logger == ("mlflow", "swanlab", "clearml", "file")


@pytest.mark.parametrize("name", sorted(UNSHIPPED_LOGGERS))
def test_unshipped_verl_logger_rejected_with_reason(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"trainer.logger=[console,{name}]"])
    assert [i.key for i in info.value.issues] == ["trainer.logger"]
    assert f"{name!r} is a verl logger not shipped here: {UNSHIPPED_LOGGERS[name]}" in str(info.value)
    with pytest.raises(ValueError, match="not shipped here"):
        TrainerConfig(logger=("console", name))  # a config built in Python is checked too


@pytest.mark.parametrize("name", sorted(OPTIONAL_BACKENDS))
def test_missing_library_names_the_extra_before_anything_opens(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, OPTIONAL_BACKENDS[name].module, None)  # as if not installed
    with pytest.raises(TrackingBackendError) as info:
        Tracking("p", "e", ["file", name], tmp_path / "run")
    message = str(info.value)
    assert f"trainer.logger includes {name!r}" in message
    assert f"pip install './core[{name}]'" in message and "pip install 'verl-core" not in message  # on no index
    assert not (tmp_path / "run" / METRICS_FILE).exists()  # checked before the file backend opened


def test_every_missing_library_is_named_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(TrackingBackendError, match=r"'wandb'.*core\[wandb\].*'mlflow'.*core\[mlflow\]"):
        Tracking("p", "e", ["wandb", "mlflow"], tmp_path)


def test_scalars_keep_numbers_only() -> None:
    data = {
        "a": 1,
        "b": np.float32(0.5),
        "c": torch.tensor(2.0),
        "d": "text",
        "e": [1, 2],
        "f": np.array([1.0, 2.0]),
        "g": True,
        "h": np.array(3),
    }
    out = scalars(data)
    assert out == {"a": 1.0, "b": 0.5, "c": 2.0, "g": 1.0, "h": 3.0}
    assert all(type(v) is float for v in out.values())


def test_flatten_params_as_verl_mlflow_params() -> None:
    config = {
        "trainer": {"total_epochs": 2, "logger": ["console", "mlflow"], "device": None},
        "data": {"train_files": [], "shuffle": True},
        "algorithm": {"kl_ctrl": {"kl_coef": 0.001}},
        "empty": {},
    }
    assert flatten_params(config) == {
        "trainer/total_epochs": 2,
        "trainer/logger/list_len": 2,
        "trainer/logger/0": "console",
        "trainer/logger/1": "mlflow",
        "trainer/device": None,
        "data/train_files/list_len": 0,
        "data/shuffle": True,
        "algorithm/kl_ctrl/kl_coef": 0.001,
        "empty": {},
    }
    assert flatten_params(None) == {}


@pytest.mark.parametrize(
    "key,expected",
    [
        ("critic/score/mean", "critic/score/mean"),
        ("val-core/openai/gsm8k/acc/best@4/mean", "val-core/openai/gsm8k/acc/best_at_4/mean"),
        ("timing_s//step", "timing_s/step"),
        ("perf/mfu(actor)", "perf/mfu_actor_"),
        ("a b:c.d-e", "a b:c.d-e"),
    ],
)
def test_mlflow_key_sanitized_as_verl(key: str, expected: str) -> None:
    assert sanitize_metric_key(key) == expected


def test_clearml_title_and_series() -> None:
    assert split_key("critic/score/mean") == ("critic", "score/mean")
    assert split_key("loss") == ("loss", "loss")
