"""Checkpoints are data, verified (issue #36, item 2): resume through the real `verl train` from damaged, truncated,
non-finite, planted and old-format checkpoints, the convert command, and rotation that keeps the healthy one.

A tiny model on 4 GSM8K rows, batch 2, a checkpoint every step. One base run of 2 steps is copied for each case; the
case damages the copy and runs the same command for 3 steps (``resume_mode=auto`` unless said otherwise). The files
are found by their stem (``data.*``, ``trainer_state.*``, ``actor/model_world_size_1_rank_0.*``) so that each test
also runs, and fails for its own reason, against the code before this change.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace

NAN_LOSS = "nan_after_resume_loss"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("integrity"), train=4, test=2)


def _args(ws: dict[str, Path], run_dir: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *extra,
    ]


@pytest.fixture(scope="module")
def base_run(workspace) -> Path:
    run_dir = workspace["root"] / "base"
    assert verl_main(_args(workspace, run_dir, 2)) == 0
    return run_dir


def _copy(base: Path, name: str) -> Path:
    target = base.parent / name
    shutil.copytree(base, target)
    return target


def _file(step_dir: Path, stem: str) -> Path:
    """The one file whose name starts with ``stem`` (``data.``, ``trainer_state.``, ``actor/model_world_size...``)."""
    folder, prefix = (step_dir / stem).parent, Path(stem).name
    found = [p for p in folder.iterdir() if p.name.startswith(prefix) and p.suffix in (".pt", ".json", ".safetensors")]
    assert len(found) == 1, found
    return found[0]


WEIGHTS = "actor/model_world_size_1_rank_0."
TRUNCATED = {"trainer_state": "trainer_state.", "data": "data.", "actor_weights": WEIGHTS}


def _flip(path: Path, at: float = 0.75, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    start = int(len(data) * at)
    for i in range(start, start + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _rows(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- corrupted / truncated checkpoints
def test_flipped_bytes_in_actor_weights_fall_back_to_the_previous_checkpoint(workspace, base_run, caplog):
    run_dir = _copy(base_run, "flipped")
    ckpt = run_dir / "ckpt"
    damaged = _file(ckpt / "global_step_2", WEIGHTS)
    _flip(damaged)
    caplog.set_level(logging.INFO)
    assert verl_main(_args(workspace, run_dir, 3)) == 0
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not resuming from")]
    assert skipped and str(damaged) in skipped[0] and "corrupt" in skipped[0], caplog.text
    assert f"resumed from {ckpt / 'global_step_1'} (step 1)" in caplog.text
    assert _rows(run_dir) == [1, 2, 3]  # step 2 ran again (its row replaced), then step 3
    from verl.trainer.checkpoint import verify_checkpoint

    verify_checkpoint(ckpt / "global_step_2")  # re-saved whole: it verifies again


def test_flipped_bytes_with_resume_path_stop_naming_the_file(workspace, base_run, capsys):
    run_dir = _copy(base_run, "flipped_path")
    ckpt = run_dir / "ckpt"
    damaged = _file(ckpt / "global_step_2", WEIGHTS)
    _flip(damaged)
    args = _args(
        workspace, run_dir, 3, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}/global_step_2"
    )
    assert verl_main(args) == 2
    err = capsys.readouterr().err
    assert str(damaged) in err and "corrupt" in err and "sha256" in err, err
    assert "Traceback" not in err
    assert _rows(run_dir) == [1, 2]  # nothing trained


def test_only_checkpoint_corrupt_stops_instead_of_training_from_scratch(workspace, base_run, capsys):
    run_dir = _copy(base_run, "flipped_only")
    ckpt = run_dir / "ckpt"
    shutil.rmtree(ckpt / "global_step_1")
    damaged = _file(ckpt / "global_step_2", WEIGHTS)
    _flip(damaged)
    assert verl_main(_args(workspace, run_dir, 3)) == 2
    err = capsys.readouterr().err
    assert "no checkpoint under" in err and "global_step_2" in err and str(damaged) in err, err
    assert "trainer.resume_mode=disable" in err  # the ways out are named
    assert (ckpt / "global_step_2").is_dir() and _rows(run_dir) == [1, 2]  # nothing moved, deleted or retrained


def test_a_finished_run_whose_last_checkpoint_is_damaged_is_not_already_finished(workspace, base_run, caplog, capsys):
    """The base run finished its 2 steps; damaging global_step_2 must not be answered with "already finished": the
    rerun falls back to global_step_1 and trains step 2 again."""
    run_dir = _copy(base_run, "finished_damaged")
    ckpt = run_dir / "ckpt"
    _flip(_file(ckpt / "global_step_2", WEIGHTS))
    caplog.set_level(logging.INFO)
    assert verl_main(_args(workspace, run_dir, 2)) == 0
    assert "already finished" not in capsys.readouterr().out
    assert f"resumed from {ckpt / 'global_step_1'} (step 1)" in caplog.text
    assert _rows(run_dir) == [1, 2]


@pytest.mark.parametrize("which", list(TRUNCATED))
def test_truncated_file_falls_back_naming_the_file(workspace, base_run, caplog, which):
    run_dir = _copy(base_run, f"truncated_{which}")
    ckpt = run_dir / "ckpt"
    damaged = _file(ckpt / "global_step_2", TRUNCATED[which])
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    caplog.set_level(logging.INFO)
    assert verl_main(_args(workspace, run_dir, 3)) == 0
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not resuming from")]
    assert skipped and str(damaged) in skipped[0] and "truncated" in skipped[0], caplog.text
    assert f"resumed from {ckpt / 'global_step_1'} (step 1)" in caplog.text
    assert _rows(run_dir) == [1, 2, 3]


def test_a_verified_checkpoint_the_worker_cannot_load_is_refused_not_offered_for_resume(workspace, base_run, capsys):
    """A checkpoint that verifies (manifest rewritten) but lacks a weight: the worker's load fails; the run stops with
    exit 2 naming the checkpoint and the ways out, not "rerun to resume" from the same folder."""
    from verl.engines.safe_files import load_tensors, save_tensors
    from verl.trainer.checkpoint import read_health, write_manifest

    run_dir = _copy(base_run, "unloadable")
    step_dir = run_dir / "ckpt" / "global_step_2"
    weights = _file(step_dir, WEIGHTS)
    tensors = load_tensors(weights)
    dropped = sorted(n for n in tensors if n.endswith("mlp.up_proj.weight"))[0]
    del tensors[dropped]
    save_tensors(weights, tensors)
    write_manifest(step_dir, step=2, health=read_health(step_dir))
    assert verl_main(_args(workspace, run_dir, 3)) == 2
    err = capsys.readouterr().err
    assert dropped in err and f"checkpoint {step_dir} could not be loaded; nothing was trained" in err, err
    assert "trainer.resume_mode=disable" in err and "rerun to resume" not in err
    assert "chained below" not in err and "verl train -v shows the worker's traceback" in err
    assert _rows(run_dir) == [1, 2]


# ---------------------------------------------------------------- non-finite weights under a valid manifest
def test_nan_weights_with_a_valid_manifest_are_refused(workspace, base_run, capsys):
    from verl.engines.safe_files import load_tensors, save_tensors
    from verl.trainer.checkpoint import CheckpointHealth, read_health, write_manifest

    run_dir = _copy(base_run, "nan_weights")
    step_dir = run_dir / "ckpt" / "global_step_2"
    weights = _file(step_dir, WEIGHTS)
    tensors = load_tensors(weights)
    name = sorted(n for n in tensors if n.endswith("mlp.down_proj.weight"))[0]
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] = float("nan")
    save_tensors(weights, tensors)
    health = read_health(step_dir)
    assert health == CheckpointHealth(True, 1, 0, [])  # what the run recorded: finite, one update applied
    write_manifest(step_dir, step=2, health=health)  # the manifest matches the files: only the load check is left
    assert verl_main(_args(workspace, run_dir, 3)) == 2
    err = capsys.readouterr().err
    assert name in err and "NaN/inf" in err and str(step_dir / "actor") in err, err
    assert "rerun to resume" not in err  # a refused checkpoint is no resume point to offer
    assert _rows(run_dir) == [1, 2]


# ---------------------------------------------------------------- pickles never run
class _Plant:
    """Unpickling this creates the marker file: the stand-in for code an attacker planted."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _write_legacy(step_dir: Path) -> None:
    """Rewrite a new-format checkpoint as the code before this change wrote it: torch.save pickles, no manifest."""
    if not (step_dir / "manifest.json").is_file():
        return  # already the old format (the test runs against the old code)
    from verl.engines.reference.checkpoint_files import load_engine_state
    from verl.trainer.rng_state import rng_state_from_json

    trainer_state = json.loads((step_dir / "trainer_state.json").read_text())
    trainer_state["rng"] = rng_state_from_json(trainer_state["rng"])
    torch.save(trainer_state, step_dir / "trainer_state.pt")
    torch.save(json.loads((step_dir / "data.json").read_text()), step_dir / "data.pt")
    actor = step_dir / "actor"
    torch.save(load_engine_state(actor, 1, 0), actor / "model_world_size_1_rank_0.pt")
    for name in ("trainer_state.json", "data.json", "manifest.json"):
        (step_dir / name).unlink()
    for pattern in ("model_world_size_1_rank_0.safetensors", "optim_world_size_*", "extra_state_world_size_*"):
        for path in actor.glob(pattern):
            path.unlink()


@pytest.mark.parametrize("target", ["data.pt", "trainer_state.pt", "actor/state.pt"])
def test_planted_pickle_in_an_old_format_checkpoint_never_runs(workspace, base_run, capsys, target):
    run_dir = _copy(base_run, f"planted_{target.replace('/', '_')}")
    ckpt = run_dir / "ckpt"
    for step in (1, 2):
        _write_legacy(ckpt / f"global_step_{step}")
    marker = run_dir / "pwned"
    torch.save(_Plant(marker), ckpt / "global_step_2" / target)
    code = verl_main(_args(workspace, run_dir, 3))
    err = capsys.readouterr().err
    assert not marker.exists(), "the planted pickle ran"
    assert code == 2, err
    assert target in err and "verl checkpoint convert" in err and "--trust-pickle" in err, err
    assert _rows(run_dir) == [1, 2]


def test_planted_pickle_beside_new_format_files_is_ignored(workspace, base_run, caplog):
    run_dir = _copy(base_run, "planted_new")
    step_dir = run_dir / "ckpt" / "global_step_2"
    marker = run_dir / "pwned"
    for name in ("data.pt", "trainer_state.pt", "actor/model_world_size_1_rank_0.pt"):
        torch.save(_Plant(marker), step_dir / name)
    caplog.set_level(logging.INFO)
    assert verl_main(_args(workspace, run_dir, 3)) == 0
    assert not marker.exists(), "the planted pickle ran"
    assert f"resumed from {step_dir} (step 2)" in caplog.text
    assert "files not in manifest.json are ignored" in caplog.text


# ---------------------------------------------------------------- verl checkpoint convert
def test_convert_round_trips_an_old_format_checkpoint(workspace, base_run, capsys, caplog):
    from safetensors.torch import load_file

    run_dir = _copy(base_run, "convert")
    ckpt = run_dir / "ckpt"
    original = run_dir.parent / "convert_original"
    shutil.copytree(ckpt, original)
    for step in (1, 2):
        _write_legacy(ckpt / f"global_step_{step}")
    marker = run_dir / "pwned"
    torch.save(_Plant(marker), ckpt / "global_step_1" / "data.pt")

    # Without the user's word nothing is loaded, for either folder.
    assert verl_main(["checkpoint", "convert", str(ckpt)]) == 2
    assert "--trust-pickle" in capsys.readouterr().err and not marker.exists()
    assert (ckpt / "global_step_2" / "data.pt").is_file() and not (ckpt / "global_step_2" / "data.json").exists()

    shutil.rmtree(ckpt / "global_step_1")  # the planted one stays unconverted: the user trusts step 2 only
    assert verl_main(["checkpoint", "convert", str(ckpt / "global_step_2"), "--trust-pickle", "--keep-old"]) == 0
    out = capsys.readouterr().out
    assert "converted" in out and "data.pt" in out and "trainer_state.pt" in out
    new, old = ckpt / "global_step_2", original / "global_step_2"
    assert (ckpt / "global_step_2.legacy-pickle" / "data.pt").is_file()  # --keep-old
    assert not list(new.rglob("*.pt")) or sorted(p.name for p in new.rglob("*.pt")) == ["optim_world_size_1_rank_0.pt"]
    for name in ("data.json", "trainer_state.json"):
        assert json.loads((new / name).read_text()) == json.loads((old / name).read_text()), name
    for name in ("model_world_size_1_rank_0.safetensors",):
        a, b = load_file(str(new / "actor" / name)), load_file(str(old / "actor" / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_new = torch.load(new / "actor" / "optim_world_size_1_rank_0.pt", weights_only=True)
    opt_old = torch.load(old / "actor" / "optim_world_size_1_rank_0.pt", weights_only=True)
    for index, state in opt_old["optimizer"]["state"].items():
        assert all(torch.equal(state[k], opt_new["optimizer"]["state"][index][k]) for k in state)
    assert verl_main(["checkpoint", "verify", str(ckpt)]) == 0
    assert "ok " in capsys.readouterr().out

    caplog.set_level(logging.INFO)
    assert verl_main(_args(workspace, run_dir, 3)) == 0
    assert f"resumed from {new} (step 2)" in caplog.text


# ---------------------------------------------------------------- rotation keeps the healthy checkpoint
def _register_nan_loss() -> None:
    from verl.algorithms import get_policy_loss_fn, register_policy_loss
    from verl.algorithms.registry import POLICY_LOSS_REGISTRY

    if NAN_LOSS in POLICY_LOSS_REGISTRY:
        return
    vanilla = get_policy_loss_fn("vanilla")

    @register_policy_loss(NAN_LOSS)
    def nan_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
        loss, out = vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kw)
        return loss * float("nan"), out


def test_rotation_keeps_the_newest_healthy_checkpoint(workspace, caplog):
    """Step 1 trains normally; the resumed run's loss is NaN, so every update of steps 2 and 3 is skipped. With
    max_actor_ckpt_to_keep=1 the plain rule would keep only global_step_3; global_step_1 stays too."""
    _register_nan_loss()
    run_dir = workspace["root"] / "rotation"
    keep = "trainer.max_actor_ckpt_to_keep=1"
    assert verl_main(_args(workspace, run_dir, 1, keep)) == 0
    caplog.set_level(logging.INFO)
    nan = f"actor_rollout_ref.actor.policy_loss.loss_mode={NAN_LOSS}"
    assert verl_main(_args(workspace, run_dir, 3, keep, nan, "trainer.max_nonfinite_steps=null")) == 0
    ckpt = run_dir / "ckpt"
    steps = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("global_step_"))
    assert steps == ["global_step_1", "global_step_3"]
    assert f"keeping {ckpt / 'global_step_1'} beyond max_ckpt_to_keep=1" in caplog.text
    assert "all 1 optimizer updates since the previous checkpoint were skipped" in caplog.text
