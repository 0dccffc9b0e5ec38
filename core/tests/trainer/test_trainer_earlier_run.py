"""``PPOTrainer(cfg, run_dir)`` used directly (no ``verl train``) keeps an earlier run's ``metrics.jsonl``.

Before the fix only the CLI renamed an earlier run aside; a direct ``init()`` + ``fit()`` in a folder with an
earlier ``metrics.jsonl`` and no checkpoint rewound that file to zero rows. One real step of a tiny model
(a few seconds on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.config import load_config, save_resolved_config
from verl.testing.workspace import make_gsm8k_workspace
from verl.trainer.earlier_run import set_aside_earlier_run
from verl.trainer.ppo_trainer import PPOTrainer

EARLIER = "".join(json.dumps({"step": s, "critic/score/mean": s / 10}) + "\n" for s in (1, 2, 3))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("earlier_run_direct"), train=4, test=2)


def _config(ws: dict[str, Path], run_dir: Path):
    return load_config(
        overrides=[
            f"data.train_files=[{ws['train']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=8",
            "data.train_batch_size=2",
            f"actor_rollout_ref.model.path={ws['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            "actor_rollout_ref.rollout.n=2",
            f"custom_reward_function.path={ws['reward']}",
            "trainer.total_training_steps=1",
            "trainer.save_freq=-1",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.logger=[file]",
        ],
        run_dir=run_dir,
    )


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_direct_fit_keeps_the_earlier_metrics_aside(workspace, tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(EARLIER)
    trainer = PPOTrainer(_config(workspace, run), run)
    with caplog.at_level("WARNING", logger="verl.trainer.ppo_trainer"):
        trainer.init()
    trainer.fit()
    kept = sorted(run.glob("metrics.*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == EARLIER  # every earlier row, byte for byte
    assert trainer.set_aside == [(run / "metrics.jsonl", kept[0])]
    assert _steps(run / "metrics.jsonl") == [1]  # this run's own row only
    assert "holds an earlier run" in caplog.text and kept[0].name in caplog.text


def test_after_the_cli_set_it_aside_the_trainer_moves_nothing(workspace, tmp_path):
    # verl train renames the earlier run aside, then writes the new config.yaml, then builds the trainer:
    # the trainer's own call must find nothing left to move (not the new config.yaml either).
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(EARLIER)
    (run / "config.yaml").write_text("# the earlier run's config\n")
    cfg = _config(workspace, run)
    moved = dict(set_aside_earlier_run(run, cfg, stamp="T"))
    assert moved == {run / "metrics.jsonl": run / "metrics.T.jsonl", run / "config.yaml": run / "config.T.yaml"}
    save_resolved_config(cfg, run)
    new_config = (run / "config.yaml").read_text()
    trainer = PPOTrainer(cfg, run)
    trainer._keep_earlier_run()
    assert trainer.set_aside == []
    assert (run / "config.yaml").read_text() == new_config
    files = sorted(p.name for p in run.iterdir() if p.is_file())
    assert files == ["config.T.yaml", "config.yaml", "metrics.T.jsonl"]
