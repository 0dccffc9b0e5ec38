"""megatron-core ``dist_checkpointing`` loads that never unpickle arbitrary objects.

What megatron-core 0.16 reads when it loads a ``torch_dist`` checkpoint (``dist_checkpointing.load`` and its
default strategies, ``strategies/common.py`` and ``strategies/torch.py``), and what this module reads instead:

============================  ====================================================  ===================================
file                          megatron-core 0.16                                    here
============================  ====================================================  ===================================
``metadata.json``             JSON (the backends)                                   JSON, must name ``torch_dist`` /
                                                                                    ``torch`` (what this engine writes)
``common.pt``                 ``torch.load`` without ``weights_only``: weights-only  ``weights_only=True`` explicitly,
                              by default since torch 2.6, a full unpickle under      then a plain-data check
                              ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``; megatron-core
                              also widens the weights-only allow-list for the whole
                              process (``safe_globals.py``: ``argparse.Namespace``,
                              numpy arrays, its ``OptimizerConfig``, ...)
``.metadata``                 DCP ``FileSystemReader.read_metadata``:               allow-list unpickler: DCP's
                              ``pickle.load``                                       metadata classes and the save plans
                                                                                    megatron-core stores there
``__<r>_<i>.distcp`` values   tensors ``weights_only=True``; non-tensor values      tensors as DCP; values
                              (sharded objects: optimizer param groups, bucket       ``weights_only=True`` + plain-data
                              sizes, the layers' ``_extra_state``) via DCP's         check
                              ``load_bytes``: ``torch.load(weights_only=False)``
``<key>/shard_*.pt``          ``torch.load`` (``load_sharded_objects``, only when    refused: ``torch_dist`` keeps
                              the sharded backend cannot store objects)             sharded objects in its shards
============================  ====================================================  ===================================

What this engine's checkpoints hold there (measured, CPU, world 1 and TP=2): ``common.pt`` is
``{"optimizer": {"param_state_sharding_type": "dp_reshardable"}}`` with the distributed optimizer, the param groups
and a ``common_step`` tensor with Megatron's plain one; the ``.distcp`` values are the distributed optimizer's param
groups and per-bucket sizes and ``None`` for every local-spec layer's ``_extra_state``: all plain data. The sharded
load (:meth:`SafeTorchDistLoadStrategy.load`) follows megatron-core 0.16's ``TorchDistLoadShardedStrategy.load``
with the reader and planner swapped (one more reason megatron-core is pinned to 0.16). Every refusal raises
:class:`~verl.engines.safe_files.CheckpointFileError` naming the file.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from megatron.core.dist_checkpointing.strategies.common import COMMON_STATE_FNAME, TorchCommonLoadStrategy
from megatron.core.dist_checkpointing.strategies.torch import MCoreLoadPlanner, TorchDistLoadShardedStrategy

from verl.engines.safe_dcp import SafeFileSystemReader, WeightsOnlyBytes, run_dcp_load
from verl.engines.safe_files import CheckpointFileError, check_plain_data, read_json

__all__ = ["SafeCommonLoadStrategy", "SafeMCoreLoadPlanner", "SafeTorchDistLoadStrategy", "load"]

CONFIG_FILE = "metadata.json"  # megatron-core's CONFIG_FNAME
SHARDED_BACKEND = "torch_dist"
COMMON_BACKEND = "torch"


class MegatronMetadataReader(SafeFileSystemReader):
    """:class:`~verl.engines.safe_dcp.SafeFileSystemReader` admitting the save plans megatron-core stores in DCP's
    metadata (``Metadata.all_local_plans``: ``SavePlan``, ``WriteItem``, ``TensorWriteData``), reading the file once
    (megatron-core's ``CachedMetadataFileSystemReader`` does the same)."""

    extra_globals = {
        "torch.distributed.checkpoint.planner": frozenset({"SavePlan", "TensorWriteData", "WriteItem"}),
    }

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._cached: Any = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if self._cached is None:
            self._cached = super().read_metadata(*args, **kwargs)
        return self._cached


class SafeMCoreLoadPlanner(WeightsOnlyBytes, MCoreLoadPlanner):
    """megatron-core's load planner (global shape checks) reading non-tensor values weights-only, as plain data."""


def _load_plain(path: Path) -> Any:
    try:
        value = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointFileError(path, "is missing") from exc
    except Exception as exc:  # UnpicklingError (a refused global), RuntimeError (not a zip: truncated), EOFError...
        raise CheckpointFileError(
            path, f"cannot be read with torch's weights-only loader (truncated, corrupt, or not data only): {exc}"
        ) from exc
    try:
        check_plain_data(value, path.name)
    except TypeError as exc:
        raise CheckpointFileError(path, f"holds objects, not plain data: {exc}") from exc
    return value


class SafeCommonLoadStrategy(TorchCommonLoadStrategy):
    """``common.pt`` read with ``torch.load(weights_only=True)`` and checked to be plain data.

    Raises:
        CheckpointFileError: ``common.pt`` missing, truncated, refused by the weights-only loader or holding objects;
            any separate sharded-object file (names the file).
    """

    def load_common(self, checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """The checkpoint's common (non-sharded) state dict."""
        path = Path(checkpoint_dir) / COMMON_STATE_FNAME
        value = _load_plain(path)
        if not isinstance(value, dict):
            raise CheckpointFileError(path, f"holds a {type(value).__name__}, not megatron-core's common state dict")
        return value

    def load_sharded_objects(self, sharded_objects_state_dict: Any, checkpoint_dir: str | os.PathLike[str]) -> Any:
        """Refused: megatron-core calls this only for a sharded backend that cannot store objects, and this engine
        writes ``torch_dist``, whose shards hold them."""
        raise CheckpointFileError(
            Path(checkpoint_dir),
            "asks for sharded objects in separate files (<key>/shard_*.pt), which verl-megatron never writes and "
            f"does not read: its checkpoints keep them in the {SHARDED_BACKEND} shards",
        )


class SafeTorchDistLoadStrategy(TorchDistLoadShardedStrategy):
    """megatron-core's ``torch_dist`` load with DCP's ``.metadata`` through an allow-list unpickler and non-tensor
    values through torch's weights-only loader.

    Raises (from ``load``):
        CheckpointFileError: unsafe or unreadable metadata or values (names the file, and the key of a value).
    """

    def load(self, sharded_state_dict: Any, checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Load the shards ``sharded_state_dict`` (megatron ``ShardedTensor``/``ShardedObject`` templates) asks for;
        collective over the ranks of the default process group. Returns the state dict with tensors and values."""
        from megatron.core.dist_checkpointing.dict_utils import nested_values
        from megatron.core.dist_checkpointing.mapping import ShardedTensor
        from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
        from torch.distributed import checkpoint

        # From here to the end: megatron-core 0.16's TorchDistLoadShardedStrategy.load, reader and planner swapped.
        templates = [t for t in nested_values(sharded_state_dict) if isinstance(t, ShardedTensor)]
        shape_checked = [t for t in templates if not t.allow_shape_mismatch]
        shape_free = {t.key: t for t in templates if t.allow_shape_mismatch}
        original = sharded_state_dict
        flat, flat_mapping, rename_mapping = mcore_torch._replace_state_dict_keys_with_sharded_keys(sharded_state_dict)
        pyt_state_dict = mcore_torch.mcore_to_pyt_state_dict(flat, True)
        reader = MegatronMetadataReader(checkpoint_dir)
        planner = SafeMCoreLoadPlanner(
            folder=checkpoint_dir,
            shapes_validation_sharded_tensors=shape_checked,
            allow_shape_mismatch_sharded_tensors=shape_free,
        )
        with warnings.catch_warnings():  # megatron-core 0.16 calls the deprecated name too: the same load
            warnings.filterwarnings("ignore", message=".*load_state_dict.* is deprecated", category=FutureWarning)
            run_dcp_load(reader, lambda: checkpoint.load_state_dict(pyt_state_dict, reader, planner=planner))
        self.cached_global_metadata = reader.read_metadata()
        state = {k: mcore_torch._unwrap_pyt_sharded_tensor(v) for k, v in pyt_state_dict.items()}
        state = mcore_torch._replace_sharded_keys_with_state_dict_keys(state, flat_mapping, rename_mapping)
        mcore_torch._restore_dict_types(state, original)
        return state

    def load_tensors_metadata(self, checkpoint_dir: str | os.PathLike[str], metadata: Any = None) -> dict[str, Any]:
        """megatron-core's, with the metadata read safely."""
        if metadata is None:
            metadata = MegatronMetadataReader(checkpoint_dir).read_metadata()
        return super().load_tensors_metadata(Path(checkpoint_dir), metadata)

    def load_sharded_metadata(self, checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """megatron-core's, with the metadata read safely."""
        from megatron.core.dist_checkpointing.mapping import ShardedObject
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata

        metadata = MegatronMetadataReader(checkpoint_dir).read_metadata()
        out: dict[str, Any] = {}
        for key, storage in metadata.state_dict_metadata.items():
            if isinstance(storage, BytesStorageMetadata):
                obj = ShardedObject.empty_from_unique_key(key)
                out[obj.unique_key] = obj
        out.update(self.load_tensors_metadata(checkpoint_dir, metadata))
        return out


def _check_config(checkpoint_dir: Path) -> None:
    path = checkpoint_dir / CONFIG_FILE
    config = read_json(path)
    found = (config.get("sharded_backend"), config.get("common_backend"))
    if found != (SHARDED_BACKEND, COMMON_BACKEND):
        raise CheckpointFileError(
            path,
            f"names the backends {found[0]!r} / {found[1]!r}; verl-megatron writes and reads only "
            f"{SHARDED_BACKEND!r} / {COMMON_BACKEND!r}",
        )


def load(sharded_state_dict: Any, checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``megatron.core.dist_checkpointing.load`` with :class:`SafeTorchDistLoadStrategy` and
    :class:`SafeCommonLoadStrategy`: nothing in ``checkpoint_dir`` is unpickled as arbitrary objects.

    Args:
        sharded_state_dict: the running model's / optimizer's ``sharded_state_dict(...)`` (the load template).
        checkpoint_dir: the ``dist_checkpointing`` folder.

    Returns:
        The loaded state dict (tensors in the template's places, common and sharded values merged in).

    Raises:
        CheckpointFileError: ``metadata.json`` unreadable or naming other backends, ``common.pt`` / ``.metadata`` /
            a ``.distcp`` value that is not data, or a missing / truncated file (names the file).
    """
    from megatron.core import dist_checkpointing

    folder = Path(checkpoint_dir)
    _check_config(folder)
    return dist_checkpointing.load(
        sharded_state_dict,
        str(folder),
        sharded_strategy=SafeTorchDistLoadStrategy(),
        common_strategy=SafeCommonLoadStrategy(),
    )
