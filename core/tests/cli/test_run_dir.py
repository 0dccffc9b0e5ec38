"""Checkpoints follow --run-dir (verl.config.run_dir); a fresh run keeps an earlier run's outputs (earlier_run)."""

from __future__ import annotations

import json
from pathlib import Path, PurePath
from types import SimpleNamespace

import attrs
import pytest
import yaml

import verl.config.backend_options as backend_options
from verl.config import load_config
from verl.config.base import DEFAULT_RUN_CONFIG_NAME, RUN_CONFIG_DIR, named_base
from verl.trainer.checkpoint import CheckpointManager
from verl.trainer.earlier_run import set_aside_earlier_run
from verl.trainer.tracking import Tracking

SHIPPED = yaml.safe_load((RUN_CONFIG_DIR / f"{DEFAULT_RUN_CONFIG_NAME}.yaml").read_text())
SHIPPED_RUN = PurePath("runs", SHIPPED["trainer"]["project_name"], SHIPPED["trainer"]["experiment_name"])
RUN_BASE = named_base(DEFAULT_RUN_CONFIG_NAME, "test")


class _AnyBackend:
    def available(self, kind: str) -> dict:
        return {"any": None}

    def get(self, kind: str, name: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, options_cls=None, devices=(), capabilities=frozenset({"data_parallel"}))


@pytest.fixture(autouse=True)
def _isolated_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_options, "default_plugin_manager", lambda: _AnyBackend())


def test_checkpoints_go_under_the_run_dir_unless_set(tmp_path: Path) -> None:
    run = tmp_path / "run_a"
    assert load_config(None, base=RUN_BASE, run_dir=run).trainer.default_local_dir == str(run / "checkpoints")
    explicit = load_config(None, [f"trainer.default_local_dir={tmp_path / 'ck'}"], base=RUN_BASE, run_dir=run)
    assert explicit.trainer.default_local_dir == str(tmp_path / "ck")
    # Without --run-dir: verl's default, checkpoints/<project>/<experiment>.
    cfg = load_config(None, base=RUN_BASE)
    assert (
        cfg.trainer.default_local_dir
        == f"checkpoints/{SHIPPED['trainer']['project_name']}/" + (SHIPPED["trainer"]["experiment_name"])
    )


@pytest.mark.parametrize("key", ["rollout_data_dir", "validation_data_dir"])
def test_the_run_configs_sample_folders_follow_the_run_dir(tmp_path: Path, key: str) -> None:
    inside = PurePath(SHIPPED["trainer"][key]).relative_to(SHIPPED_RUN)  # e.g. "rollouts"
    run = tmp_path / "run_b"
    assert getattr(load_config(None, base=RUN_BASE, run_dir=run).trainer, key) == str(run / inside)
    # Another experiment name without --run-dir: its default run folder.
    cfg = load_config(None, ["trainer.experiment_name=other"], base=RUN_BASE)
    assert getattr(cfg.trainer, key) == str(SHIPPED_RUN.parent / "other" / inside)
    # The default run keeps the shipped value; a value the user gives stays as written.
    assert getattr(load_config(None, base=RUN_BASE).trainer, key) == SHIPPED["trainer"][key]
    mine = load_config(None, [f"trainer.{key}={tmp_path / 'mine'}"], base=RUN_BASE, run_dir=run)
    assert getattr(mine.trainer, key) == str(tmp_path / "mine")


def _cfg(tmp_path: Path, **trainer) -> object:
    cfg = load_config(None, run_dir=tmp_path / "run")
    return attrs.evolve(cfg, trainer=attrs.evolve(cfg.trainer, **trainer))


def _log_rows(run_dir: Path, steps: range) -> str:
    """Write a real metrics.jsonl through the file logger; return its text."""
    tracking = Tracking("p", "e", backends=["file"], run_dir=run_dir)
    for step in steps:
        tracking.log({"critic/score/mean": step / 10}, step=step)
    tracking.close()
    return (run_dir / "metrics.jsonl").read_text()


def test_fresh_run_moves_earlier_metrics_aside_instead_of_rewinding_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    earlier = _log_rows(run, range(0, 4))
    assert [json.loads(line)["step"] for line in earlier.splitlines()] == [0, 1, 2, 3]
    (run / "config.yaml").write_text("trainer: {}\n")
    (run / "final_hf").mkdir()
    (run / "final_hf" / "config.json").write_text("{}")
    cfg = _cfg(tmp_path, rollout_data_dir=str(run / "rollouts"))
    (run / "rollouts").mkdir()
    (run / "rollouts" / "1.jsonl").write_text('{"step": 1}\n')
    # the file logger draws metrics.png at close when matplotlib is installed (the [plot] extra)
    png = {run / "metrics.png": run / "metrics.T1.png"} if (run / "metrics.png").exists() else {}
    moved = dict(set_aside_earlier_run(run, cfg, stamp="T1"))
    assert moved == {
        **png,
        run / "metrics.jsonl": run / "metrics.T1.jsonl",
        run / "final_hf": run / "final_hf.T1",
        run / "rollouts": run / "rollouts.T1",
        run / "config.yaml": run / "config.T1.yaml",
    }
    assert (run / "metrics.T1.jsonl").read_text() == earlier
    assert (run / "final_hf.T1" / "config.json").read_text() == "{}"
    # What the trainer then does to the new file (Tracking.rewind(0) at a fresh start) leaves it alone.
    tracking = Tracking("p", "e", backends=["file"], run_dir=run)
    tracking.rewind(0)
    tracking.close()
    assert (run / "metrics.T1.jsonl").read_text() == earlier
    # A second fresh run in the same second gets a free name; an empty metrics file is not a run.
    _log_rows(run, range(0, 1))
    assert dict(set_aside_earlier_run(run, cfg, stamp="T1"))[run / "metrics.jsonl"] == run / "metrics.T1-2.jsonl"
    (run / "metrics.jsonl").write_text("")
    assert set_aside_earlier_run(run, cfg, stamp="T2") == []


def _save_checkpoint(root: Path, step: int) -> None:
    CheckpointManager(root).save(step, {"trainer_state.json": {"global_steps": step}})


def test_a_run_that_resumes_moves_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    earlier = _log_rows(run, range(0, 3))
    cfg = _cfg(tmp_path)
    _save_checkpoint(Path(cfg.trainer.default_local_dir), 2)
    assert set_aside_earlier_run(run, cfg, stamp="T") == []
    assert (run / "metrics.jsonl").read_text() == earlier


def test_resume_disable_keeps_the_earlier_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _log_rows(run, range(0, 3))
    cfg = _cfg(tmp_path, resume_mode="disable")
    root = Path(cfg.trainer.default_local_dir)
    _save_checkpoint(root, 2)
    moved = dict(set_aside_earlier_run(run, cfg, stamp="T"))
    assert moved[root] == root.with_name("checkpoints.T")
    assert CheckpointManager(root.with_name("checkpoints.T")).latest()[0] == 2
    # Checkpoints in the run folder itself: the step folders and tracker move, not the run folder.
    cfg = _cfg(tmp_path, resume_mode="disable", default_local_dir=str(run))
    _save_checkpoint(run, 3)
    moved = dict(set_aside_earlier_run(run, cfg, stamp="U"))
    assert moved[run / "global_step_3"] == run / "global_step_3.U"
    assert run.is_dir() and not (run / "latest_checkpointed_iteration.txt").exists()
