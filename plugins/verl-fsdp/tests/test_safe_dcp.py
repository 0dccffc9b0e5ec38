"""DCP checkpoints read without unpickling arbitrary objects (issue #36): the allow-list metadata reader and the
weights-only planner load what DCP wrote, and refuse a planted ``.metadata`` or a planted non-tensor value before it
can run (the stock loader runs both)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from verl_fsdp.safe_dcp import SafeFileSystemReader, WeightsOnlyLoadPlanner, load, load_keys

from verl.engines.safe_files import CheckpointFileError


class _Plant:
    """Unpickling this creates the marker file (the stand-in for planted code)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture(autouse=True)
def _single_process_warning():
    with warnings.catch_warnings():  # DCP without a process group warns that it loads in one process: intended
        warnings.filterwarnings("ignore", message=".*single process.*")
        yield


def _save(folder: Path, state: dict) -> None:
    dcp.save(state, checkpoint_id=str(folder))


def test_safe_reader_and_planner_load_what_dcp_wrote(tmp_path):
    model, optimizer = _trained(0)
    _save(tmp_path, dict(zip(("model", "optimizer"), get_state_dict(model, [optimizer]), strict=True)))
    other, other_opt = _trained(1)  # other weights and moments: the load must replace all of them
    model_sd, optim_sd = get_state_dict(other, [other_opt])
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, storage_reader=SafeFileSystemReader(str(tmp_path)), planner=WeightsOnlyLoadPlanner())
    expected_model, expected_optim = get_state_dict(model, [optimizer])
    assert all(torch.equal(state["model"][k], expected_model[k]) for k in expected_model)
    for key, moments in expected_optim["state"].items():
        assert all(torch.equal(state["optimizer"]["state"][key][m], moments[m]) for m in moments)
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.01  # a non-tensor value, read weights-only
    keys = load_keys(tmp_path, {"model.0.weight"})
    assert torch.equal(keys["model"]["0.weight"] if "model" in keys else keys["model.0.weight"], model[0].weight)


def test_planted_metadata_is_refused_before_it_runs(tmp_path):
    model, _ = _trained(0)
    _save(tmp_path, {"model": model.state_dict()})
    marker = tmp_path / "pwned"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    with pytest.raises(CheckpointFileError, match=r"\.metadata.*not allowed in DCP metadata"):
        SafeFileSystemReader(str(tmp_path)).read_metadata()
    assert not marker.exists()
    with pytest.raises(CheckpointFileError, match="truncated|safely"):
        (tmp_path / ".metadata").write_bytes(b"\x80\x04")  # cut short
        SafeFileSystemReader(str(tmp_path)).read_metadata()


def test_planted_metadata_is_refused_by_name_through_the_whole_load(tmp_path):
    """Through ``load``: torch's loader, when ``.metadata`` fails, falls back to per-rank metadata files and hides the
    refusal in an ``AssertionError`` inside a ``CheckpointException`` (a ``BaseException``); the file is named."""
    model, _ = _trained(0)
    _save(tmp_path, {"model": model.state_dict()})
    marker = tmp_path / "pwned"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    with pytest.raises(CheckpointFileError) as info:
        load({"model": model.state_dict()}, tmp_path)
    assert info.value.path == tmp_path / ".metadata"
    assert not marker.exists()


def test_planted_non_tensor_value_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "pwned"
    _save(tmp_path / "ckpt", {"w": torch.ones(2), "extra": _Plant(marker)})
    assert not marker.exists()
    state = {"w": torch.zeros(2), "extra": None}
    with pytest.raises(CheckpointFileError, match="extra.*not plain data") as info:
        load(state, tmp_path / "ckpt")
    assert info.value.path.parent == tmp_path / "ckpt" and info.value.path.suffix == ".distcp"  # the file holding it
    assert not marker.exists()
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))  # the stock loader: the planted value runs
    assert marker.exists()
