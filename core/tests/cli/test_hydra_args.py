"""verl.cli.hydra_args: verl's Hydra command line (python -m verl.trainer.main_ppo ARGS) as a verl train run."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.cli.hydra_args import TRAINER_DIR, split_hydra_argv, translate
from verl.config import ConfigError
from verl.config.base import DEFAULT_RUN_CONFIG_NAME, RUN_CONFIG_DIR
from verl.config.compose import BUILTIN


def test_overrides_keep_their_order_and_plus_forms() -> None:
    run = translate(["a.b=1", "+c.d=[x,y]", "++e=f", "--config-name=ppo_trainer"])
    assert run.overrides == ("a.b=1", "+c.d=[x,y]", "++e=f")
    assert (run.config_file, run.base.name, run.base.path, run.show) == (None, "ppo_trainer", None, False)
    assert "--config-name=ppo_trainer" in run.base.reason


def test_no_config_name_is_verls_ppo_trainer_and_the_config_dir_is_builtin() -> None:
    for argv in ([], ["--config-path=config"], ["-cp", "./config"], ["--config-path", str(RUN_CONFIG_DIR)]):
        run = translate(argv)
        assert run.base.name == "ppo_trainer" and run.config_file is None, argv
    assert TRAINER_DIR / "config" == RUN_CONFIG_DIR  # Hydra's rule: relative to main_ppo.py's directory
    shipped = translate(["-cn", f"{DEFAULT_RUN_CONFIG_NAME}.yaml"])
    assert shipped.base.path == RUN_CONFIG_DIR / f"{DEFAULT_RUN_CONFIG_NAME}.yaml"


def test_hydra_run_dir_searchpath_and_logging_settings(tmp_path: Path) -> None:
    run = translate(
        [
            f"hydra.run.dir={tmp_path}/out",
            f"hydra.searchpath=[file://{tmp_path},pkg://verl.trainer.config]",
            "hydra/job_logging=disabled",
            "hydra.job.chdir=False",
            "x.y=1",
        ]
    )
    assert run.run_dir == f"{tmp_path}/out"
    assert run.search_path == (tmp_path, BUILTIN)
    assert run.overrides == ("x.y=1",)
    assert len(run.notes) == 3 and all(n.split(":")[0] in str(run.notes) for n in run.notes)
    assert any("hydra/job_logging=disabled: dropped" in n for n in run.notes)
    assert any("checkpoints stay at trainer.default_local_dir" in n for n in run.notes)


def test_refused_arguments_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        translate(
            [
                "~actor_rollout_ref.model.lora",
                "hydra.launcher.n_jobs=4",
                "hydra.job.chdir=true",
                "--multirun",
                "--cfg",
                "hydra",
                "stray",
                "hydra.run.dir=outputs/${now:%H}",
                "--config-name=ppo_megatron_trainer",
            ]
        )
    text = str(info.value)
    assert len(info.value.issues) == 8, text
    for needle in (
        "deleting a key is not supported",
        "hydra.launcher.n_jobs=4: a Hydra launcher/sweeper setting",
        "hydra.job.chdir=true: runs here keep the working directory",
        "--multirun: sweeps are not run here",
        "--cfg=hydra: only --cfg job",
        "argument 'stray' is not a key=value override",
        "interpolations are not resolved here",
        "model_engine=megatron",
    ):
        assert needle in text
    assert "--config-name=ppo_megatron_trainer" in {i.key for i in info.value.issues}


def test_config_path_outside_verls_config_dir_names_the_file(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "mine.yaml").write_text("defaults: [ppo_trainer, _self_]\n")
    run = translate([f"--config-path={tmp_path}", "--config-name=mine", "--cfg=job"])
    assert (run.config_file, run.base, run.show) == (tmp_path / "mine.yaml", None, True)
    # A name not in the directory falls back to the search path, then fails naming where it looked.
    with pytest.raises(ConfigError, match=r"no .*other\.yaml"):
        translate([f"--config-path={tmp_path}", "--config-name=other"])
    # Relative paths start at verl/trainer/ (Hydra's rule), not the working directory: the error says so.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"directory of main_ppo.py.*\$\(pwd\)/here"):
        translate(["--config-path=here", "--config-name=mine"])
    # --config-dir (relative to the working directory) adds a directory that --config-name searches.
    assert translate(["--config-dir=.", "--config-name=mine"]).config_file == Path.cwd() / "mine.yaml"


def test_split_takes_separate_and_joined_flag_values() -> None:
    split = split_hydra_argv(
        ["-cp", "config", "--config-name", "x", "-cd=d", "+hydra.verbose=true", "k=v", "--resolve"]
    )
    assert (split.config_path, split.config_name, split.config_dirs) == ("config", "x", ("d",))
    assert (split.hydra, split.overrides, split.flags, split.stray) == (
        ("+hydra.verbose=true",),
        ("k=v",),
        ("--resolve",),
        (),
    )
