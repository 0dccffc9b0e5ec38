"""``--config-name NAME`` (Hydra's flag) for ``verl train`` and ``verl config show``, and main_ppo's."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.cli.main import main
from verl.config.base import SCHEMA_BASE_NAME, run_configs
from verl.config.loader import read_yaml_file
from verl.config.yaml_io import load_yaml
from verl.trainer.main_ppo import main as main_ppo


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, dict]:
    assert main(["config", "show", *argv]) == 0
    out = capsys.readouterr().out
    return out.splitlines()[0], load_yaml(out)


def test_config_show_starts_from_the_named_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = read_yaml_file(run_configs()["dapo_trainer"])
    line, tree = _show(capsys, "--config-name", "dapo_trainer", "data.max_response_length=300")
    assert line.startswith("# base config: dapo_trainer ") and line.endswith("--config-name=dapo_trainer")
    assert tree["reward_model"]["reward_manager"] == shipped["reward_model"]["reward_manager"] == "dapo"
    assert tree["trainer"]["project_name"] == shipped["trainer"]["project_name"] == "verl-dapo"
    assert tree["data"]["max_response_length"] == 300  # overrides still go on top
    # Everything the built-in does not set is verl's defaults (ppo_trainer), not the CPU run config.
    _, bare = _show(capsys, "--schema-defaults")
    assert tree["algorithm"]["adv_estimator"] == bare["algorithm"]["adv_estimator"] == "gae"
    assert tree["data"]["train_batch_size"] == bare["data"]["train_batch_size"] == 1024
    # -cn and a .yaml suffix, options anywhere (Hydra's spellings); ppo_trainer = --schema-defaults.
    assert _show(capsys, "data.max_response_length=300", "-cn=dapo_trainer.yaml")[1] == tree
    assert _show(capsys, f"--config-name={SCHEMA_BASE_NAME}")[1] == bare


@pytest.mark.parametrize("command", ["train", "config show"])
def test_unknown_name_lists_the_builtin_names(capsys: pytest.CaptureFixture[str], command: str) -> None:
    assert main([*command.split(), "--config-name", "dapo_trainr"]) == 2
    err = capsys.readouterr().err
    assert "--config-name: unknown base config 'dapo_trainr'" in err and "Traceback" not in err
    assert f"known: {', '.join([SCHEMA_BASE_NAME, *run_configs()])}" in err
    assert "dapo_trainer" in run_configs()


def test_a_name_and_a_file_or_schema_defaults_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_size: 8\n")
    assert main(["config", "show", str(path), "--config-name", "dapo_trainer"]) == 2
    err = capsys.readouterr().err
    assert (
        f"--config-name=dapo_trainer and the CONFIG file '{path}'" in err and "defaults: [dapo_trainer, _self_]" in err
    )
    assert main(["train", "--schema-defaults", "--config-name", "dapo_trainer"]) == 2
    assert "--config-name=dapo_trainer and --schema-defaults" in capsys.readouterr().err


def test_main_ppo_config_name_is_the_same_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    _, shown = _show(capsys, "--config-name", "dapo_trainer")
    assert main_ppo(["--config-name", "dapo_trainer", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# base config: dapo_trainer ") and load_yaml(out) == shown
    assert main_ppo(["--config-name=dapo_trainr"]) == 2
    assert "verl's dapo_trainr.yaml is not a built-in config here (built-in: ppo_trainer, dapo_trainer" in (
        capsys.readouterr().err
    )
