"""wandb backend, offline (WANDB_MODE=offline): what the run's .wandb transaction log holds after logging.

The log is read back with wandb's own reader (``wandb leet inspect --json``, one JSON record per line).
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from verl.trainer.tracking import METRICS_FILE, Tracking

wandb = pytest.importorskip("wandb")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wandb_dir = tmp_path / "wandb_dir"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout alone
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    return wandb_dir


def read_run(wandb_dir: Path) -> list[dict]:
    """Every record of the one offline run under ``wandb_dir``."""
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    cli = shutil.which("wandb")
    assert cli is not None, "the wandb command comes with the wandb package"
    out = subprocess.run([cli, "leet", "inspect", "--json", str(run_file)], capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def history(records: list[dict]) -> dict[int, dict]:
    return {int(r["history"]["step"]["num"]): r["history"]["item"] for r in records if r["type"] == "history"}


def test_scalars_config_and_samples_reach_the_offline_run(offline: Path, tmp_path: Path) -> None:
    config = {"trainer": {"project_name": "proj", "total_epochs": 3}, "algorithm": {"adv_estimator": "grpo"}}
    with Tracking("proj", "exp", ["wandb", "file"], tmp_path / "run", config_dict=config) as tracking:
        tracking.log({"critic/score/mean": 0.25, "actor/pg_loss": np.float32(-0.5), "note": "text"}, step=1)
        tracking.log({"critic/score/mean": 0.75, "response_length/mean": 12.0}, step=2)
        tracking.log_generations([("q1", "a1", 1.0), ("q2", "a2", 0.0)], step=2)
    records = read_run(offline)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert (run["project"], run["display_name"]) == ("proj", "exp")
    assert run["config"]["update"]["trainer"] == config["trainer"]
    assert run["config"]["update"]["algorithm"] == config["algorithm"]
    steps = history(records)
    assert sorted(steps) == [1, 2]
    assert steps[1]["critic/score/mean"] == 0.25 and steps[1]["actor/pg_loss"] == -0.5
    assert "note" not in steps[1]  # text is kept by the file backend only
    assert steps[2]["critic/score/mean"] == 0.75 and steps[2]["response_length/mean"] == 12.0
    # A table is logged as a reference to its JSON file, flattened into "val/generations.<field>" items.
    table_ref = {k.split(".", 1)[1]: v for k, v in steps[2].items() if k.startswith("val/generations.")}
    assert table_ref["_type"] == "table-file" and table_ref["nrows"] == 1
    (table_file,) = offline.glob(f"wandb/offline-run-*/files/{table_ref['path']}")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert table["data"] == [[2, "q1", "a1", 1.0, "q2", "a2", 0.0]]
    (exit_record,) = [r for r in records if r["type"] == "exit"]
    assert exit_record["exit"].get("exit_code", 0) == 0


def test_failed_run_is_marked_with_its_exit_code(offline: Path, tmp_path: Path) -> None:
    tracking = Tracking("proj", "exp", ["wandb"], tmp_path)
    tracking.log({"x": 1.0}, step=1)
    tracking.finish(exit_code=3)
    (exit_record,) = [r for r in read_run(offline) if r["type"] == "exit"]
    assert exit_record["exit"]["exit_code"] == 3


def test_verl_train_with_console_and_wandb(offline: Path, tmp_path: Path) -> None:
    """``trainer.logger=[console,file,wandb]`` through ``verl train``: wandb gets metrics.jsonl's values."""
    from verl.cli.main import main as verl_main
    from verl.testing.workspace import make_gsm8k_workspace

    reward = (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n"
    )
    ws = make_gsm8k_workspace(tmp_path / "ws", train=4, test=2, reward_source=reward)
    run_dir = tmp_path / "run"
    code = verl_main(
        [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{ws['train']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={ws['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            f"custom_reward_function.path={ws['reward']}",
            "reward_model.num_workers=1",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.project_name=wandb_e2e",
            "trainer.experiment_name=tiny",
            "trainer.logger=[console,file,wandb]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    records = read_run(offline)
    steps = history(records)
    assert sorted(steps) == [r["step"] for r in rows] == [1, 2]
    for row in rows:
        logged = steps[row["step"]]
        for key in ("critic/score/mean", "actor/pg_loss", "response_length/mean"):
            assert math.isclose(logged[key], row[key], rel_tol=1e-12), key
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["project"] == "wandb_e2e" and run["display_name"] == "tiny"
    assert run["config"]["update"]["trainer"]["logger"] == ["console", "file", "wandb"]
    if importlib.util.find_spec("matplotlib") is not None:  # the plot extra: curves beside metrics.jsonl
        assert (run_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
