"""Run-folder details (issue #15): a resumed run with other settings keeps the earlier ``config.yaml`` as
``config.<stamp>.yaml``; "training from scratch" is said once per run, not by every caller of resolve_resume."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

from verl.cli.main import main
from verl.config import load_config, save_resolved_config
from verl.config.yaml_io import load_yaml
from verl.trainer.checkpoint import TRACKER_FILE, CheckpointManager
from verl.trainer.checkpoint_manifest import write_manifest
from verl.trainer.earlier_run import keep_changed_config, set_aside_earlier_run
from verl.trainer.ppo_trainer import PPOTrainer


def _cfg(*overrides: str):
    return load_config(
        overrides=["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", *overrides]
    )


def test_same_settings_keep_nothing_even_with_another_header(tmp_path):
    cfg = _cfg()
    save_resolved_config(cfg, tmp_path, header="base config: one")
    assert keep_changed_config(tmp_path, cfg, stamp="T") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_changed_settings_keep_the_earlier_file_byte_for_byte(tmp_path):
    save_resolved_config(_cfg(), tmp_path, header="base config: one")
    earlier = (tmp_path / "config.yaml").read_bytes()
    changed = _cfg("actor_rollout_ref.actor.optim.lr=3e-6")
    kept = keep_changed_config(tmp_path, changed, stamp="20250101-000000")
    assert kept == tmp_path / "config.20250101-000000.yaml" and kept.read_bytes() == earlier
    assert not (tmp_path / "config.yaml").exists()  # the caller writes the new one next
    save_resolved_config(changed, tmp_path)
    again = keep_changed_config(tmp_path, _cfg(), stamp="20250101-000000")  # changed back, same second
    assert again == tmp_path / "config.20250101-000000-2.yaml"
    assert load_yaml(again.read_text())["actor_rollout_ref"]["actor"]["optim"]["lr"] == 3e-6


def test_no_earlier_file_or_an_unreadable_one(tmp_path):
    assert keep_changed_config(tmp_path, _cfg()) is None
    (tmp_path / "config.yaml").write_text("data: [unclosed\n")
    kept = keep_changed_config(tmp_path, _cfg(), stamp="T")
    assert kept == tmp_path / "config.T.yaml" and kept.read_text() == "data: [unclosed\n"


def _finished_run(run: Path) -> None:
    """A run folder whose single step is checkpointed (a checkpoint that verifies: its manifest), logged with its
    validation and exported: `verl train` stops before loading anything."""
    (run / "checkpoints" / "global_step_1").mkdir(parents=True)
    (run / "checkpoints" / "global_step_1" / "data.json").write_text("{}")
    write_manifest(run / "checkpoints" / "global_step_1", step=1)
    (run / "checkpoints" / TRACKER_FILE).write_text("1")
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "val-core/openai/gsm8k/acc/mean@1": 0.0, "timing_s/testing": 1.0}\n'
    )
    (run / "final_hf").mkdir()


def _train(run: Path, train_file: Path, *overrides: str) -> int:
    args = ["train", "--run-dir", str(run), f"data.train_files=[{train_file}]", "trainer.total_training_steps=1"]
    return main([*args, *overrides])


def test_verl_train_on_a_finished_run_keeps_the_earlier_config_when_settings_change(tmp_path, capsys):
    run, train_file = tmp_path / "run", tmp_path / "train.parquet"
    train_file.write_bytes(b"")
    _finished_run(run)
    assert _train(run, train_file) == 0
    first = (run / "config.yaml").read_text()
    assert _train(run, train_file) == 0  # same settings: nothing kept, nothing said
    out = capsys.readouterr().out
    assert sorted(p.name for p in run.glob("config*.yaml")) == ["config.yaml"] and "kept it as" not in out
    assert _train(run, train_file, "actor_rollout_ref.actor.optim.lr=2e-6") == 0
    out = capsys.readouterr().out
    kept = [p for p in run.glob("config.*.yaml")]
    assert len(kept) == 1 and kept[0].read_text() == first
    assert out.count("kept it as") == 1 and str(kept[0]) in out
    assert load_yaml((run / "config.yaml").read_text())["actor_rollout_ref"]["actor"]["optim"]["lr"] == 2e-6


def test_from_scratch_is_logged_once_by_the_trainer_not_by_each_lookup(tmp_path, caplog):
    cfg = _cfg(f"trainer.default_local_dir={tmp_path / 'ck'}")
    with caplog.at_level(logging.INFO):
        CheckpointManager(tmp_path / "ck").resolve_resume("auto")
        set_aside_earlier_run(tmp_path, cfg)  # verl train's call, then the trainer's own
        set_aside_earlier_run(tmp_path, cfg)
        assert "from scratch" not in caplog.text
        trainer = SimpleNamespace(config=cfg, checkpoints=CheckpointManager(tmp_path / "ck"))
        assert PPOTrainer.load_checkpoint(trainer) == 0
    lines = [r.getMessage() for r in caplog.records if "from scratch" in r.getMessage()]
    assert lines == [f"no checkpoint under {tmp_path / 'ck'}: training from scratch"]


def test_disable_is_not_reported_as_a_missing_checkpoint(tmp_path, caplog):
    cfg = _cfg("trainer.resume_mode=disable")
    with caplog.at_level(logging.INFO):
        trainer = SimpleNamespace(config=cfg, checkpoints=CheckpointManager(tmp_path / "ck"))
        assert PPOTrainer.load_checkpoint(trainer) == 0
    assert "no checkpoint under" not in caplog.text
