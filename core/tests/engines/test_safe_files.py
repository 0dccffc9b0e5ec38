"""Checkpoint files are data (issue #36): safetensors with tied names, weights-only torch files, strict JSON, the
non-finite scan, and the reference engine's per-rank files; every refusal names the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from verl.engines.reference.checkpoint_files import load_engine_state, save_engine_state
from verl.engines.safe_files import (
    CheckpointFileError,
    LegacyCheckpointError,
    check_plain_data,
    engine_nonfinite_state,
    load_tensors,
    load_weights_only,
    nonfinite_tensors,
    read_json,
    save_tensors,
    save_weights_only,
    write_json,
)


class _Plant:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_tensors_round_trip_with_tied_names_stored_once(tmp_path):
    embed = torch.randn(5, 3)
    tensors = {"embed.weight": embed, "lm_head.weight": embed, "norm": torch.randn(3).to(torch.bfloat16)}
    path = tmp_path / "m.safetensors"
    save_tensors(path, tensors)
    with safe_open(str(path), framework="pt") as handle:
        assert sorted(handle.keys()) == ["embed.weight", "norm"]  # the alias is not stored twice
    back = load_tensors(path)
    assert sorted(back) == sorted(tensors)
    assert back["norm"].dtype == torch.bfloat16 and torch.equal(back["norm"], tensors["norm"])
    assert torch.equal(back["lm_head.weight"], embed)
    assert back["lm_head.weight"].data_ptr() == back["embed.weight"].data_ptr()  # still one tensor


def test_truncated_safetensors_names_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    save_tensors(path, {"w": torch.randn(64, 64)})
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointFileError, match=r"m\.safetensors.*truncated or corrupt"):
        load_tensors(path)


def test_weights_only_files_refuse_objects_both_ways(tmp_path):
    with pytest.raises(TypeError, match=r"opt\.pt: state\.x is a PosixPath"):
        save_weights_only(tmp_path / "opt.pt", {"state": {"x": tmp_path}})
    marker = tmp_path / "pwned"
    planted = tmp_path / "planted.pt"
    torch.save({"optimizer": _Plant(marker)}, planted)
    with pytest.raises(CheckpointFileError, match=r"planted\.pt.*weights-only"):
        load_weights_only(planted)
    assert not marker.exists()
    save_weights_only(tmp_path / "ok.pt", {"state": {0: {"step": torch.tensor(3.0)}}, "lr": 0.1, "betas": (0.9, 0.99)})
    assert load_weights_only(tmp_path / "ok.pt")["betas"] == (0.9, 0.99)


def test_json_is_strict_and_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="state.json"):
        write_json(tmp_path / "state.json", {"kl": float("nan")})
    (tmp_path / "cut.json").write_text('{"global_steps": 3, "rng": {"py')
    with pytest.raises(CheckpointFileError, match=r"cut\.json: is not valid JSON"):
        read_json(tmp_path / "cut.json")
    (tmp_path / "nan.json").write_text('{"kl": NaN}')
    with pytest.raises(CheckpointFileError, match="nan.json.*non-finite number NaN"):
        read_json(tmp_path / "nan.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(CheckpointFileError, match="expected a dict"):
        read_json(tmp_path / "list.json")


def test_nonfinite_scan_names_float_tensors_only():
    named = [
        ("ok", torch.ones(3)),
        ("nan", torch.tensor([1.0, float("nan")])),
        ("inf", torch.tensor([float("-inf")], dtype=torch.bfloat16)),
        ("int", torch.tensor([1, 2])),
        ("scalar", float("inf")),
        ("empty", torch.empty(0)),
        ("overflowing_sum", torch.full((4,), 3e38)),  # finite values whose sum is inf: the exact test decides
    ]
    assert nonfinite_tensors(named) == ["nan", "inf", "scalar"]


def test_engine_nonfinite_state_checks_parameters_and_optimizer_moments():
    class Engine:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters())

    engine = Engine()
    engine.model(torch.ones(1, 2)).sum().backward()
    engine.optimizer.step()
    assert engine_nonfinite_state(engine) == ([], [])
    engine.optimizer.state[engine.model.bias]["exp_avg_sq"][0] = float("inf")
    assert engine_nonfinite_state(engine) == ([], ["group0.param1.exp_avg_sq"])
    with torch.no_grad():
        engine.model.weight[0, 0] = float("nan")
    assert engine_nonfinite_state(engine)[0] == ["weight"]


def test_an_engine_answering_nonfinite_state_itself_is_asked_first():
    """An engine whose optimizer is not a ``torch.optim.Optimizer`` (verl-megatron's) answers through
    ``nonfinite_state()``; its ``.model`` is then not scanned a second time."""

    class Engine:
        model = torch.nn.Linear(2, 2)

        def nonfinite_state(self):
            return ("weight",), ["optimizer0.group0.param0.exp_avg"]

    with torch.no_grad():
        Engine.model.bias[0] = float("nan")  # what the engine's own answer leaves out is not added
    assert engine_nonfinite_state(Engine()) == (["weight"], ["optimizer0.group0.param0.exp_avg"])


def test_check_plain_data_names_the_offending_value():
    import argparse

    check_plain_data({"a": [1, 2.5, None, "s", b"b", torch.ones(2), torch.float32, torch.Size([2]), (True,)]}, "f")
    with pytest.raises(TypeError, match=r"common\.pt: optimizer\.groups\[1\] is a Namespace"):
        check_plain_data({"optimizer": {"groups": [{}, argparse.Namespace()]}}, "common.pt")


def test_engine_state_files_round_trip_and_refuse_the_old_format(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = {
        "model": model.state_dict(),
        "lora": False,
        "global_step": 7,
        "skipped_steps": 2,
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
    }
    save_engine_state(tmp_path, state, 2, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "extra_state_world_size_2_rank_1.json",
        "model_world_size_2_rank_1.safetensors",
        "optim_world_size_2_rank_1.pt",
    ]
    assert json.loads((tmp_path / "extra_state_world_size_2_rank_1.json").read_text())["skipped_steps"] == 2
    back = load_engine_state(tmp_path, 2, 1)
    assert (back["global_step"], back["skipped_steps"], back["lora"]) == (7, 2, False)
    assert all(torch.equal(back["model"][k], v) for k, v in state["model"].items())
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    with pytest.raises(CheckpointFileError, match=r"extra_state_world_size_1_rank_0\.json.*another world size"):
        load_engine_state(tmp_path, 1, 0)

    old = tmp_path / "old"
    old.mkdir()
    torch.save(state, old / "model_world_size_1_rank_0.pt")
    with pytest.raises(LegacyCheckpointError, match=r"model_world_size_1_rank_0\.pt.*verl checkpoint convert"):
        load_engine_state(old, 1, 0)
