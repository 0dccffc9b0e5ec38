"""Core's DCP reading rules (issue #36), without a plugin: the metadata allow-list and how a plugin widens it, the
weights-only value planner naming the ``.distcp`` file of a refused value, and refusals coming out of DCP's
``CheckpointException`` as themselves. verl-fsdp's and verl-megatron's tests run them on their real checkpoints."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import SavePlan

from verl.engines.safe_dcp import MetadataUnpickler, SafeFileSystemReader, WeightsOnlyBytes, run_dcp_load
from verl.engines.safe_files import CheckpointFileError


class _Plant:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _Planner(WeightsOnlyBytes, DefaultLoadPlanner):
    pass


@pytest.fixture(autouse=True)
def _single_process_warning():
    with warnings.catch_warnings():  # DCP without a process group warns that it loads in one process: intended
        warnings.filterwarnings("ignore", message=".*single process.*")
        yield


def _saved(folder: Path, state: dict) -> Path:
    dcp.save(state, checkpoint_id=str(folder))
    return folder


def test_metadata_allow_list_admits_dcp_classes_and_dtypes_only(tmp_path):
    import io

    good = pickle.dumps({"shape": torch.Size([2, 3]), "dtype": torch.bfloat16, "layout": torch.strided})
    assert MetadataUnpickler(io.BytesIO(good)).load() == {
        "shape": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "layout": torch.strided,
    }
    with pytest.raises(pickle.UnpicklingError, match=r"io\.open is not allowed"):
        MetadataUnpickler(io.BytesIO(pickle.dumps(_Plant(tmp_path / "ran")))).load()
    with pytest.raises(pickle.UnpicklingError, match=r"torch\.manual_seed is not allowed"):  # not a dtype / layout
        MetadataUnpickler(io.BytesIO(b"ctorch\nmanual_seed\n.")).load()
    assert not (tmp_path / "ran").exists()


def test_a_reader_subclass_widens_the_allow_list_for_its_own_classes(tmp_path):
    folder = _saved(tmp_path / "ckpt", {"w": torch.ones(2)})
    metadata = SafeFileSystemReader(str(folder)).read_metadata()
    metadata.planner_data = SavePlan(items=[])  # a class DCP's own metadata never holds (megatron-core's do)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointFileError, match=r"SavePlan is not allowed") as info:
        SafeFileSystemReader(str(folder)).read_metadata()
    assert info.value.path == folder / ".metadata"

    class Wider(SafeFileSystemReader):
        extra_globals = {"torch.distributed.checkpoint.planner": frozenset({"SavePlan"})}

    assert Wider(str(folder)).read_metadata().planner_data == SavePlan(items=[])
    assert "SavePlan" not in SafeFileSystemReader.extra_globals.get("torch.distributed.checkpoint.planner", ())


def test_values_are_read_weights_only_as_plain_data_and_a_refusal_names_the_distcp_file(tmp_path):
    import argparse

    def load(folder: Path, state: dict) -> None:
        reader = SafeFileSystemReader(str(folder))
        run_dcp_load(reader, lambda: dcp.load(state, storage_reader=reader, planner=_Planner(folder=folder)))

    state = {"w": torch.zeros(2), "lr": None, "name": None}
    load(_saved(tmp_path / "ok", {"w": torch.ones(2), "lr": 0.1, "name": "adamw"}), state)
    assert torch.equal(state["w"], torch.ones(2)) and state["lr"] == 0.1 and state["name"] == "adamw"

    for name, value in (("plant", _Plant(tmp_path / "ran")), ("namespace", argparse.Namespace(lr=1.0))):
        folder = _saved(tmp_path / name, {"w": torch.ones(2), "extra": value})
        with pytest.raises(CheckpointFileError, match="'extra' is not plain data") as info:
            load(folder, {"w": torch.zeros(2), "extra": None})
        assert info.value.path.parent == folder and info.value.path.suffix == ".distcp", info.value.path
    assert not (tmp_path / "ran").exists()


def test_a_planted_metadata_is_named_before_dcp_falls_back_to_per_rank_files(tmp_path):
    folder = _saved(tmp_path / "ckpt", {"w": torch.ones(2)})
    (folder / ".metadata").write_bytes(pickle.dumps(_Plant(tmp_path / "ran")))
    reader = SafeFileSystemReader(str(folder))
    state = {"w": torch.zeros(2)}
    with pytest.raises(CheckpointFileError) as info:
        run_dcp_load(reader, lambda: dcp.load(state, storage_reader=reader, planner=_Planner(folder=folder)))
    assert info.value.path == folder / ".metadata"
    assert not (tmp_path / "ran").exists()
