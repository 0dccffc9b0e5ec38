"""Reading ``torch.distributed.checkpoint`` (DCP) folders without unpickling arbitrary objects.

DCP keeps two pickles: the ``.metadata`` file (``FileSystemReader.read_metadata`` is a plain ``pickle.load``) and
every non-tensor value of the state dict (optimizer hyper-parameters, ...), which ``DefaultLoadPlanner.load_bytes``
reads with ``torch.load(weights_only=False)``. A file planted in a checkpoint would run as the trainer at resume.
Here the metadata goes through an unpickler that admits only DCP's own metadata classes, ``torch.Size``, dtypes,
layouts and paths (the "restricting globals" recipe of Python's ``pickle`` docs), and the values through torch's
weights-only loader. What is refused raises :class:`~verl.engines.safe_files.CheckpointFileError` naming the file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner

from verl.engines.safe_files import CheckpointFileError

__all__ = ["SafeFileSystemReader", "WeightsOnlyEmptyPlanner", "WeightsOnlyLoadPlanner", "load", "load_keys"]

METADATA_FILE = ".metadata"

_ALLOWED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "PureWindowsPath", "WindowsPath"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and "." not in name:
            value = getattr(torch, name, None)  # dtypes / layouts / memory formats pickle as torch.<name>
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read by an allow-list unpickler.

    Raises (from ``read_metadata``):
        CheckpointFileError: the metadata is missing, truncated, or names any other class (the message names it).
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        path = Path(self._get_metadata_path(rank))
        try:
            with self.fs.create_stream(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except FileNotFoundError as exc:
            raise CheckpointFileError(path, "is missing: not a torch.distributed.checkpoint folder") from exc
        except Exception as exc:  # UnpicklingError (refused class), EOFError (truncated), ...
            raise CheckpointFileError(path, f"is not DCP metadata that can be read safely: {exc}") from exc
        if getattr(metadata, "storage_data", None) is None or not hasattr(metadata, "state_dict_metadata"):
            raise CheckpointFileError(path, f"holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _weights_only(read_item: Any, value: io.BytesIO) -> Any:
    try:
        return torch.load(value, weights_only=True)
    except Exception as exc:
        fqn = getattr(getattr(read_item, "dest_index", None), "fqn", "?")
        raise CheckpointFileError(fqn, f"a non-tensor value of the DCP checkpoint is not plain data: {exc}") from exc


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` reading non-tensor values with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = _weights_only(read_item, value)
        super().load_bytes(read_item, _saved(loaded))


class WeightsOnlyEmptyPlanner(_EmptyStateDictLoadPlanner):
    """The planner of a load without a template (``verl export``), with the same weights-only rule."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = _weights_only(read_item, value)
        super().load_bytes(read_item, _saved(loaded))


def _saved(value: Any) -> io.BytesIO:
    # The parent class torch.load()s what it gets: hand it the already-checked value re-saved (tensors and plain
    # data only, so reloading it cannot run code either).
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def _unwrapped(call: Any) -> Any:
    """Run a DCP load; a CheckpointFileError raised inside comes out as itself (DCP wraps every failure in a
    ``CheckpointException``, a ``BaseException`` that ``except Exception`` and the CLI would not catch)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return call()
    except CheckpointException as exc:
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, CheckpointFileError):
                raise inner from exc
        raise


def load(state: dict[str, Any], folder: str | Path) -> None:
    """``dcp.load(state, folder)`` (collective when a process group exists) with the safe reader and planner.

    Raises:
        CheckpointFileError: unsafe or unreadable metadata or values (names the file or key).
    """
    import torch.distributed.checkpoint as dcp

    _unwrapped(
        lambda: dcp.load(state, storage_reader=SafeFileSystemReader(str(folder)), planner=WeightsOnlyLoadPlanner())
    )


def load_keys(folder: str | Path, keys: set[str]) -> dict[str, Any]:
    """Read only ``keys`` of a DCP folder into new tensors, in this one process (no process group), safely.

    Raises:
        CheckpointFileError: unsafe or unreadable metadata or values (names the file or key).
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _unwrapped(
        lambda: _load_state_dict(
            state_dict=state,
            storage_reader=SafeFileSystemReader(str(folder)),
            process_group=None,
            no_dist=True,
            planner=WeightsOnlyEmptyPlanner(keys=keys),
        )
    )
    return state
