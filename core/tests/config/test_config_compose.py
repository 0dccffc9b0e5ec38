"""verl.config.compose: defaults lists naming the user's own YAML files, _self_ positions, hydra.searchpath."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl.cli.main import main
from verl.config import ConfigError, load_config
from verl.config.base import DEFAULT_RUN_CONFIG_NAME, RUN_CONFIG_DIR
from verl.config.compose import BUILTIN, compose, resolve_search_entry
from verl.config.schema import RootConfig

SHIPPED = yaml.safe_load((RUN_CONFIG_DIR / f"{DEFAULT_RUN_CONFIG_NAME}.yaml").read_text())
BARE = RootConfig()
# verl's own header (e.g. verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml).
VERL_HEADER = "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def test_verls_header_loads_as_ppo_trainer(tmp_path: Path) -> None:
    path = _write(tmp_path, "run", VERL_HEADER + "data:\n  train_batch_size: 512\n")
    cfg = load_config(path)
    assert cfg.data.train_batch_size == 512
    assert cfg.algorithm.adv_estimator == BARE.algorithm.adv_estimator
    assert compose(path).base.name == "ppo_trainer"
    for entry in ("file://verl/trainer/config", "pkg://verl.trainer.config", f"file://{RUN_CONFIG_DIR}"):
        assert resolve_search_entry(entry) == BUILTIN


def test_a_chain_of_user_files_composes_in_hydra_order(tmp_path: Path, capsys) -> None:
    # run -> [common, _self_]; common -> [cpu, _self_]; cpu -> [<shipped run config>, _self_]
    _write(tmp_path, "cpu", f"defaults: [{DEFAULT_RUN_CONFIG_NAME}, _self_]\ntrainer:\n  experiment_name: cpu\n")
    _write(
        tmp_path,
        "common",
        "defaults: [cpu, _self_]\ntrainer:\n  experiment_name: common\n  project_name: p\ndata:\n  seed: 7\n",
    )
    run = _write(tmp_path, "run", "defaults:\n  - common\n  - _self_\ntrainer:\n  experiment_name: chained\n")
    cfg = load_config(run)
    # Each file wins over what its list brings in; the run config is the bottom.
    assert (cfg.trainer.experiment_name, cfg.trainer.project_name, cfg.data.seed) == ("chained", "p", 7)
    assert cfg.data.train_batch_size == SHIPPED["data"]["train_batch_size"]
    assert cfg.algorithm.adv_estimator == SHIPPED["algorithm"]["adv_estimator"]
    # The one-line report names the base and every file, in merge order.
    assert main(["config", "show", str(run)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    chain = f"{DEFAULT_RUN_CONFIG_NAME} <- {tmp_path / 'cpu.yaml'} <- {tmp_path / 'common.yaml'} <- {run}"
    assert line.startswith(f"# base config: {DEFAULT_RUN_CONFIG_NAME} (built-in run config")
    assert f"composed in this order: {chain};" in line


def test_self_position_is_respected(tmp_path: Path) -> None:
    _write(tmp_path, "other", "data:\n  train_batch_size: 2048\n  seed: 3\n")
    last = load_config(_write(tmp_path, "a", "defaults: [other, _self_]\ndata:\n  train_batch_size: 512\n"))
    first = load_config(_write(tmp_path, "b", "defaults: [_self_, other]\ndata:\n  train_batch_size: 512\n"))
    implicit = load_config(_write(tmp_path, "c", "defaults: [other]\ndata:\n  train_batch_size: 512\n"))
    assert (last.data.train_batch_size, first.data.train_batch_size, implicit.data.train_batch_size) == (512, 2048, 512)
    assert last.data.seed == first.data.seed == 3
    # ppo_trainer after the file puts verl's defaults back over it, as Hydra merges.
    reset = load_config(_write(tmp_path, "d", "defaults: [_self_, ppo_trainer]\ndata:\n  train_batch_size: 512\n"))
    assert reset.data.train_batch_size == BARE.data.train_batch_size == 1024


def test_searchpath_dirs_are_relative_to_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    _write(tmp_path / "shared", "sizes", "data:\n  train_batch_size: 2048\n")
    run = _write(
        tmp_path / "runs",
        "run",
        "hydra:\n  searchpath: [file://shared, file://verl/trainer/config]\ndefaults: [ppo_trainer, sizes, _self_]\n",
    )
    monkeypatch.chdir(tmp_path)
    assert load_config(run).data.train_batch_size == 2048
    monkeypatch.chdir(tmp_path / "runs")  # file://shared is now runs/shared, which does not exist
    with pytest.raises(ConfigError, match=r"unknown base config 'sizes'.*no file .*runs/sizes\.yaml or shared/sizes"):
        load_config(run)


def test_schema_defaults_drops_the_run_config_but_keeps_the_users_files(tmp_path: Path, capsys) -> None:
    _write(tmp_path, "mine", f"defaults: [{DEFAULT_RUN_CONFIG_NAME}, _self_]\ndata:\n  train_batch_size: 512\n")
    run = _write(tmp_path, "run", "defaults: [mine, _self_]\n")
    assert main(["config", "show", "--schema-defaults", str(run)]) == 0
    out = capsys.readouterr().out
    tree = yaml.safe_load(out)
    assert tree["data"]["train_batch_size"] == 512
    assert tree["algorithm"]["adv_estimator"] == BARE.algorithm.adv_estimator
    assert out.splitlines()[0].startswith("# base config: ppo_trainer ") and "--schema-defaults" in out.splitlines()[0]


@pytest.mark.parametrize(
    "files,needle",
    [
        ({"a": "defaults: [b]\n", "b": "defaults: [a]\n"}, "cycle: {a} -> {b} -> {a}"),
        ({"a": "hydra:\n  run:\n    dir: x\n"}, "only hydra.searchpath has a meaning here"),
        ({"a": "hydra:\n  searchpath: [pkg://no_such_pkg_h10.config]\n"}, "'no_such_pkg_h10.config' is not importable"),
        ({"a": "defaults: [model_engine/megatron]\n"}, "selects a Hydra config group"),
    ],
)
def test_compositions_it_cannot_honour_are_errors(tmp_path: Path, capsys, files: dict, needle: str) -> None:
    paths = {name: _write(tmp_path, name, text) for name, text in files.items()}
    needle = needle.format(**{n: p.resolve() for n, p in paths.items()})
    with pytest.raises(ConfigError) as info:
        load_config(paths["a"])
    assert needle in str(info.value)
    assert main(["config", "show", str(paths["a"])]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
