"""Which base a config starts from (verl.config.base), printed by `verl config show` / `verl train`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import verl.config.backend_options as backend_options
from verl.cli.main import main
from verl.config import ConfigError, load_config, save_resolved_config
from verl.config.base import DEFAULT_RUN_CONFIG_NAME, RUN_CONFIG_DIR, named_base, schema_base
from verl.config.schema import RootConfig
from verl.config.yaml_io import load_yaml

SHIPPED = yaml.safe_load((RUN_CONFIG_DIR / f"{DEFAULT_RUN_CONFIG_NAME}.yaml").read_text())
BARE = RootConfig()


class _AnyBackend:
    def available(self, kind: str) -> dict:
        return {"any": None}

    def get(self, kind: str, name: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, options_cls=None, devices=(), capabilities=frozenset({"data_parallel"}))


@pytest.fixture(autouse=True)
def _isolated_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_options, "default_plugin_manager", lambda: _AnyBackend())


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


SMALL = "data:\n  train_batch_size: 16\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 8\n"


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, dict]:
    assert main(["config", "show", *argv]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    return out.splitlines()[0], load_yaml(out)


def test_no_file_starts_from_the_default_run_config(capsys: pytest.CaptureFixture[str]) -> None:
    line, tree = _show(capsys)
    assert line.startswith(f"# base config: {DEFAULT_RUN_CONFIG_NAME} ") and "no CONFIG file given" in line
    assert tree["algorithm"]["adv_estimator"] == SHIPPED["algorithm"]["adv_estimator"] == "grpo"
    assert tree["data"]["train_batch_size"] == SHIPPED["data"]["train_batch_size"]


def test_file_without_defaults_starts_from_verls_defaults(tmp_path: Path, capsys) -> None:
    line, tree = _show(capsys, str(_file(tmp_path, SMALL)))
    assert line.startswith("# base config: ppo_trainer ") and "has no defaults: list" in line
    # The line states the schema's own values, and the config has them.
    assert f"algorithm.adv_estimator={BARE.algorithm.adv_estimator} with a critic" in line
    assert tree["algorithm"]["adv_estimator"] == BARE.algorithm.adv_estimator == "gae"
    assert tree["critic"]["enable"] is True
    assert tree["actor_rollout_ref"]["model"]["path"] == BARE.actor_rollout_ref.model.path


@pytest.mark.parametrize("entries", ["[ppo_trainer, _self_]", "[ppo_trainer]", "[_self_]"])
def test_defaults_list_naming_ppo_trainer(tmp_path: Path, capsys, entries: str) -> None:
    line, tree = _show(capsys, str(_file(tmp_path, f"defaults: {entries}\n{SMALL}")))
    assert line.startswith("# base config: ppo_trainer ") and "named by the defaults list" in line
    assert tree == _show(capsys, "--schema-defaults", str(_file(tmp_path, SMALL)))[1]


def test_defaults_list_naming_the_run_config_layers_the_file_over_it(tmp_path: Path, capsys) -> None:
    path = _file(tmp_path, f"defaults:\n  - {DEFAULT_RUN_CONFIG_NAME}\n  - _self_\n{SMALL}")
    line, tree = _show(capsys, str(path), "actor_rollout_ref.rollout.n=2")
    assert line.startswith(f"# base config: {DEFAULT_RUN_CONFIG_NAME} ")
    assert (tree["data"]["train_batch_size"], tree["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]) == (16, 8)
    assert tree["actor_rollout_ref"]["rollout"]["n"] == 2  # the override wins over both
    # Everything the file does not set comes from the shipped run config, not the schema.
    assert tree["algorithm"]["adv_estimator"] == SHIPPED["algorithm"]["adv_estimator"]
    assert tree["actor_rollout_ref"]["model"]["path"] == SHIPPED["actor_rollout_ref"]["model"]["path"]
    assert tree["data"]["max_response_length"] == SHIPPED["data"]["max_response_length"]
    # --schema-defaults forces the bare schema whatever the file says.
    line, tree = _show(capsys, "--schema-defaults", str(path))
    assert line.startswith("# base config: ppo_trainer ") and "--schema-defaults" in line
    assert tree["algorithm"]["adv_estimator"] == "gae"


@pytest.mark.parametrize(
    "defaults,needle",
    [
        (f"[ppo_trainer, {DEFAULT_RUN_CONFIG_NAME}]", "name one base config"),
        (
            "[ppo_trainr]",
            f"unknown base config 'ppo_trainr'; known: ppo_trainer, dapo_trainer, {DEFAULT_RUN_CONFIG_NAME}",
        ),
        ("[ppo_trainer, {override model_engine: megatron}]", "actor_rollout_ref.actor.strategy"),
        ("ppo_trainer", "must be a list"),
    ],
)
def test_defaults_lists_it_cannot_honour_are_errors(tmp_path: Path, capsys, defaults: str, needle: str) -> None:
    assert main(["config", "show", str(_file(tmp_path, f"defaults: {defaults}\n"))]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="defaults"):
        load_config(_file(tmp_path, f"defaults: {defaults}\n"))


def test_config_yaml_records_the_base_and_still_loads(tmp_path: Path) -> None:
    base = named_base(DEFAULT_RUN_CONFIG_NAME, "no CONFIG file given")
    cfg = load_config(None, base=base)
    path = save_resolved_config(cfg, tmp_path, header=base.describe())
    assert path.read_text().splitlines()[0] == f"# {base.describe()}"
    assert load_config(path) == cfg  # the comment is ignored; the saved config is complete
    assert schema_base("x").describe() != base.describe()


def test_programmatic_load_config_keeps_the_schema_base(tmp_path: Path) -> None:
    assert load_config(_file(tmp_path, SMALL)).algorithm.adv_estimator == BARE.algorithm.adv_estimator
    cfg = load_config(_file(tmp_path, f"defaults: [{DEFAULT_RUN_CONFIG_NAME}, _self_]\n"))
    assert cfg.actor_rollout_ref.rollout.n == SHIPPED["actor_rollout_ref"]["rollout"]["n"]
