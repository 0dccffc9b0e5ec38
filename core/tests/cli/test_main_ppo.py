"""python -m verl.trainer.main_ppo (verl's entry point) and the note for verl-like overrides over the CPU run config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl.cli.main import main
from verl.config.base import DEFAULT_RUN_CONFIG_NAME

# From a verl example script (examples/grpo_trainer/run_qwen2-7b.sh), minus the vLLM rollout and the data files.
VERL_OVERRIDES = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "+actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "++actor_rollout_ref.rollout.n=5",
    "trainer.logger=[console]",
    "trainer.total_epochs=15",
]


def _python(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_main_ppo_cfg_job_prints_what_config_show_schema_defaults_prints(tmp_path: Path) -> None:
    ours = _python(
        "-m", "verl.trainer.main_ppo", "--cfg", "job", *VERL_OVERRIDES, "hydra/job_logging=disabled", cwd=tmp_path
    )
    assert ours.returncode == 0, ours.stderr
    show = _python("-m", "verl.cli.main", "config", "show", "--schema-defaults", *VERL_OVERRIDES, cwd=tmp_path)
    assert show.returncode == 0, show.stderr
    ours_lines, show_lines = ours.stdout.splitlines(), show.stdout.splitlines()
    # Same config; only the reason on the base line differs.
    assert ours_lines[1:] == show_lines[1:]
    assert ours_lines[0].startswith("# base config: ppo_trainer (verl's defaults")
    assert "python -m verl.trainer.main_ppo --config-name=ppo_trainer" in ours_lines[0]
    assert "hydra/job_logging=disabled: dropped" in ours.stderr


def test_main_ppo_config_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    bad = _python("-m", "verl.trainer.main_ppo", *VERL_OVERRIDES, "actor_rollout_ref.actor.ppo_epochz=1", cwd=tmp_path)
    assert bad.returncode == 2 and "ppo_epochz" in bad.stderr and "Traceback" not in bad.stderr
    refused = _python(
        "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer", "hydra.sweeper.x=1", cwd=tmp_path
    )
    assert (
        refused.returncode == 2 and "model_engine=megatron" in refused.stderr and "hydra.sweeper.x=1" in refused.stderr
    )
    # verl's schema defaults have no data files: verl train says so (what a verl script without data gets).
    train = _python("-m", "verl.trainer.main_ppo", *VERL_OVERRIDES, f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert train.returncode == 2 and "data.train_files is not set" in train.stderr, train.stderr
    assert "base config: ppo_trainer" in train.stdout


def test_help_names_the_forms(tmp_path: Path) -> None:
    out = _python("-m", "verl.trainer.main_ppo", "--help", cwd=tmp_path)
    assert out.returncode == 0 and "--config-name" in out.stdout and "hydra.run.dir" in out.stdout


@pytest.mark.parametrize(
    "overrides,sign",
    [
        (["trainer.n_gpus_per_node=8"], "trainer.n_gpus_per_node=8 looks"),
        (["+trainer.device=cuda"], "+trainer.device=cuda looks"),
        (["actor_rollout_ref.rollout.name=vllm"], "actor_rollout_ref.rollout.name=vllm looks"),
        (["trainer.total_epochs=2", "trainer.nnodes=2"], "trainer.total_epochs=2, trainer.nnodes=2 look"),
    ],
)
def test_verl_like_overrides_over_the_builtin_run_config_get_a_note(capsys, overrides, sign) -> None:
    main(["config", "show", *overrides])
    err = capsys.readouterr().err
    assert f"note: the overrides ({sign} like a verl script's) were applied over the built-in CPU run config" in err
    assert DEFAULT_RUN_CONFIG_NAME in err and "trainer.device=cpu" in err and "dynamic batch sizes" in err
    assert "--schema-defaults or use python -m verl.trainer.main_ppo" in err


def test_note_on_config_errors_and_not_otherwise(tmp_path: Path, capsys) -> None:
    assert main(["config", "show", "data.train_batch_size=3"]) == 2  # breaks the run config's batch sizes
    err = capsys.readouterr().err
    assert "note: the overrides were applied over the built-in CPU run config" in err and "error:" in err
    for argv in (
        ["data.seed=3", "trainer.n_gpus_per_node=1"],  # fine over the CPU run config, nothing verl-like
        ["trainer.device=cpu"],  # this product's devices, not a verl script's (a vendor name is refused later)
        ["--schema-defaults", "trainer.n_gpus_per_node=8"],
    ):
        main(["config", "show", *argv])
        assert "note:" not in capsys.readouterr().err, argv
