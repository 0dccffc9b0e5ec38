"""verl-megatron checkpoints are data (issue #36): a pickle planted in any file megatron-core would unpickle at resume
never runs, and the refusal names the file; the actor worker reports and refuses non-finite weights and optimizer state.

One process, world size 1 (gloo), the engine the worker builds (default options: the distributed optimizer). A
trainable engine takes one step and saves; each test copies that checkpoint, plants or damages one file and loads
it into another engine, as resume does. The planted object's ``__reduce__`` opens (creates) a marker file: the
stand-in for code. megatron-core's own loaders run the ``.metadata`` and ``.distcp`` plants (``pickle.load`` and
``torch.load(weights_only=False)``) and, under ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, the ``common.pt`` one.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from verl.engines.safe_files import CheckpointFileError, NonFiniteCheckpointError


class _Plant:
    """Unpickling this creates the file ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def make(megatron_world_of_one: None, scenarios: Any, megatron_models: dict[str, Path]) -> Any:
    """``make(model_key="model") -> engine``: a trainable ``megatron`` engine built as the worker builds it."""
    from verl.plugins import get_plugin_manager
    from verl.testing.conformance.build import build_training_engine

    spec = get_plugin_manager().get("training_engine", "megatron")

    def build(model_key: str = "model") -> Any:
        cfg = scenarios.megatron_config(megatron_models[model_key], {})
        return build_training_engine(
            spec, cfg, model=megatron_models[model_key], total_training_steps=scenarios.TOTAL_TRAINING_STEPS
        )

    return build


@pytest.fixture(scope="module")
def saved(make: Any, scenarios: Any, megatron_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The folder of a trainable engine saved after one step (the round trip itself is tested at TP=2, in
    ``test_megatron_checkpoint.py``)."""
    from verl.testing.conformance.inputs import make_training_batch
    from verl.workers.losses import make_ppo_loss

    engine = make()
    cfg = scenarios.megatron_config(megatron_models["model"], {})
    engine.train_batch(make_training_batch(), make_ppo_loss(cfg.actor_rollout_ref.actor))
    folder = tmp_path_factory.mktemp("megatron_safe") / "actor"
    engine.save_checkpoint(folder)
    return folder


@pytest.fixture(scope="module")
def loader(make: Any) -> Any:
    """The engine that loads the planted copies (another model: other initial weights)."""
    return make("other")


@pytest.fixture
def copy(saved: Path, tmp_path: Path) -> Path:
    """A copy of the saved checkpoint folder, to plant into."""
    return Path(shutil.copytree(saved, tmp_path / "actor"))


def _refused(loader: Any, folder: Path, marker: Path) -> CheckpointFileError:
    with pytest.raises(CheckpointFileError) as info:
        loader.load_checkpoint(folder)
    assert not marker.exists(), "the planted pickle ran while the checkpoint was loaded"
    return info.value


def _plant_value(dist_dir: Path, key_prefix: str, payload: Any) -> Path:
    """Point the DCP value whose key starts with ``key_prefix`` at a new pickle of ``payload`` appended to its
    ``.distcp`` file (an attacker rewrites ``.metadata`` too); returns that file."""
    metadata = pickle.loads((dist_dir / ".metadata").read_bytes())  # this test's own checkpoint, just written
    index = next(i for i in metadata.storage_data if i.fqn.startswith(key_prefix))
    info = metadata.storage_data[index]
    blob = io.BytesIO()
    torch.save(payload, blob)
    target = dist_dir / info.relative_path
    offset = target.stat().st_size
    with target.open("ab") as handle:
        handle.write(blob.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob.getvalue()))
    (dist_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    return target


def test_planted_metadata_never_runs(copy: Path, loader: Any, tmp_path: Path):
    marker = tmp_path / "ran"
    (copy / "dist_ckpt" / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    error = _refused(loader, copy, marker)
    assert error.path == copy / "dist_ckpt" / ".metadata"
    assert "io.open is not allowed in DCP metadata" in str(error)


def test_truncated_metadata_is_named(copy: Path, loader: Any, tmp_path: Path):
    path = copy / "dist_ckpt" / ".metadata"
    path.write_bytes(path.read_bytes()[:100])
    error = _refused(loader, copy, tmp_path / "never")
    assert error.path == path


@pytest.mark.parametrize(
    "key", ["optimizer.distributed.dp_group_idx_0.optimizer/", "decoder.layers.mlp.linear_fc1._extra_state/"]
)
def test_planted_value_in_a_distcp_shard_never_runs(copy: Path, loader: Any, tmp_path: Path, key: str):
    """The optimizer's param groups and a layer's ``_extra_state``: sharded objects, stored as pickles in the shards."""
    marker = tmp_path / "ran"
    shard = _plant_value(copy / "dist_ckpt", key, [_Plant(marker)])
    error = _refused(loader, copy, marker)
    assert error.path == shard, str(error)
    assert key in str(error) and "not plain data" in str(error)


@pytest.mark.parametrize("force_unsafe", [False, True], ids=["default", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"])
def test_planted_common_pt_never_runs(copy: Path, loader: Any, tmp_path: Path, monkeypatch: Any, force_unsafe: bool):
    """megatron-core reads ``common.pt`` with torch's default, which users switch to a full unpickle with
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (the usual workaround for old checkpoints): here it is weights-only
    whatever the environment says."""
    if force_unsafe:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    torch.save({"optimizer": _Plant(marker)}, copy / "dist_ckpt" / "common.pt")
    error = _refused(loader, copy, marker)
    assert error.path == copy / "dist_ckpt" / "common.pt"
    assert "weights-only" in str(error)


def test_common_pt_holding_objects_is_refused(copy: Path, loader: Any, tmp_path: Path):
    """megatron-core adds ``argparse.Namespace`` (and more) to torch's weights-only allow-list for the whole process;
    this engine's ``common.pt`` holds plain data only, and anything else is refused."""
    import argparse

    torch.save({"optimizer": argparse.Namespace(lr=1.0)}, copy / "dist_ckpt" / "common.pt")
    error = _refused(loader, copy, tmp_path / "never")
    assert error.path == copy / "dist_ckpt" / "common.pt"
    assert "Namespace" in str(error)


def test_other_backends_in_metadata_json_are_refused(copy: Path, loader: Any, tmp_path: Path):
    path = copy / "dist_ckpt" / "metadata.json"
    path.write_text('{"sharded_backend": "zarr", "sharded_backend_version": 1, "common_backend": "torch"}')
    error = _refused(loader, copy, tmp_path / "never")
    assert error.path == path and "'zarr'" in str(error)


def test_sharded_object_files_are_never_read(tmp_path: Path):
    """``<key>/shard_*.pt`` files (megatron-core's object store for backends without one) are refused unread."""
    from verl_megatron.safe_dist_ckpt import SafeCommonLoadStrategy

    marker = tmp_path / "ran"
    (tmp_path / "optimizer").mkdir()
    torch.save(_Plant(marker), tmp_path / "optimizer" / "shard_0_1.pt")
    with pytest.raises(CheckpointFileError, match="never writes and does not read"):
        SafeCommonLoadStrategy().load_sharded_objects({"optimizer": None}, tmp_path)
    assert not marker.exists()


def test_sharded_metadata_matches_megatron_core_and_is_read_safely(copy: Path, tmp_path: Path):
    """The safe strategy's ``load_sharded_metadata`` (megatron-core's strict-load check) lists what megatron-core's
    own lists, and refuses a planted ``.metadata``."""
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy
    from verl_megatron.safe_dist_ckpt import SafeTorchDistLoadStrategy

    dist_dir = copy / "dist_ckpt"
    ours = SafeTorchDistLoadStrategy().load_sharded_metadata(dist_dir)
    theirs = TorchDistLoadShardedStrategy().load_sharded_metadata(dist_dir)
    assert ours.keys() == theirs.keys() and len(ours) > 10
    assert all(repr(ours[k]) == repr(theirs[k]) for k in ours)
    marker = tmp_path / "ran"
    (dist_dir / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    with pytest.raises(CheckpointFileError, match=r"\.metadata"):
        SafeTorchDistLoadStrategy().load_sharded_metadata(dist_dir)
    assert not marker.exists()


def test_workers_report_and_refuse_nonfinite_megatron_state(
    megatron_world_of_one: None, scenarios: Any, megatron_models: dict[str, Path], tmp_path: Path
):
    """The actor worker on this engine: its save reports non-finite weights (the checkpoint's health), and its load
    refuses non-finite weights and non-finite optimizer moments. Megatron's optimizer is not a
    ``torch.optim.Optimizer``; the engine's ``nonfinite_state()`` covers it."""
    from verl.testing.conformance.inputs import make_training_batch
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.losses import make_ppo_loss

    cfg = scenarios.megatron_config(megatron_models["model"], {})
    saver, loader = ActorRolloutRefWorker(cfg, role="actor"), ActorRolloutRefWorker(cfg, role="actor")
    for worker in (saver, loader):
        worker.init_model(scenarios.TOTAL_TRAINING_STEPS)
    saver.actor.train_batch(make_training_batch(), make_ppo_loss(cfg.actor_rollout_ref.actor))
    inner = saver.actor.mm._inner_optimizers()[0].optimizer
    with torch.no_grad():
        inner.state[inner.param_groups[0]["params"][0]]["exp_avg"].view(-1)[0] = float("nan")
    assert saver.save_checkpoint(str(tmp_path / "nan_moment")) == {"rank": 0, "nonfinite": []}  # weights finite
    with pytest.raises(NonFiniteCheckpointError) as info:
        loader.load_checkpoint(str(tmp_path / "nan_moment"))
    assert info.value.what == "optimizer state" and info.value.names == ["optimizer0.group0.param0.exp_avg"]

    name, weight = next(iter(saver.actor.mm.base.named_parameters()))
    with torch.no_grad():
        weight.view(-1)[0] = float("inf")
    assert saver.save_checkpoint(str(tmp_path / "inf_weight")) == {"rank": 0, "nonfinite": [name]}
    with pytest.raises(NonFiniteCheckpointError) as info:
        loader.load_checkpoint(str(tmp_path / "inf_weight"))
    assert info.value.what == "parameters" and info.value.names == [name]
