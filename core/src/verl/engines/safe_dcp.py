"""Reading ``torch.distributed.checkpoint`` (DCP) files without unpickling arbitrary objects.

DCP keeps two kinds of pickle: the ``.metadata`` file (``FileSystemReader.read_metadata`` is a plain
``pickle.load``) and every non-tensor value of the state dict (optimizer hyper-parameters, Megatron's sharded
objects), which ``DefaultLoadPlanner.load_bytes`` reads with ``torch.load(weights_only=False)``. A file planted in
a checkpoint would run as the trainer at resume. Here the metadata goes through an unpickler that admits only DCP's
own metadata classes, ``torch.Size``, dtypes, layouts and paths (the "restricting globals" recipe of Python's
``pickle`` docs), and the values through torch's weights-only loader followed by a check that what came back is
plain data (tensors, containers, numbers, strings, dtypes). What is refused raises
:class:`~verl.engines.safe_files.CheckpointFileError` naming the file.

Both sharded-engine plugins build on this module: verl-fsdp reads its DCP checkpoints with it, verl-megatron reads
megatron-core's ``torch_dist`` checkpoints (DCP underneath) with it. Tensors themselves are safe already: DCP reads
them with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from torch.distributed.checkpoint import FileSystemReader

from verl.engines.safe_files import CheckpointFileError, check_plain_data

__all__ = [
    "DCP_METADATA_GLOBALS",
    "METADATA_FILE",
    "MetadataUnpickler",
    "SafeFileSystemReader",
    "WeightsOnlyBytes",
    "run_dcp_load",
]

METADATA_FILE = ".metadata"

#: ``{module: names}`` a DCP ``.metadata`` file may name: DCP's metadata classes and the torch / stdlib values
#: they hold. Nothing here runs code when unpickled (dataclasses, enums, ``torch.Size``, paths).
DCP_METADATA_GLOBALS: Mapping[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.planner": frozenset({"LoadItemType", "WriteItemType"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "PureWindowsPath", "WindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "slice"}),
}


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``allowed`` (plus torch dtypes, layouts and memory formats).

    Args:
        file: a binary stream holding one pickle.
        allowed: ``{module: names}``; :data:`DCP_METADATA_GLOBALS` by default.

    Raises (from ``load``):
        pickle.UnpicklingError: the pickle names any other global ("``module.name`` is not allowed in DCP metadata").
    """

    def __init__(self, file: Any, allowed: Mapping[str, Iterable[str]] = DCP_METADATA_GLOBALS):
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if name in self._allowed.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and "." not in name:
            value = getattr(torch, name, None)  # dtypes / layouts / memory formats pickle as torch.<name>
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` is read by :class:`MetadataUnpickler`.

    A subclass widens the allow-list with :attr:`extra_globals` (megatron-core, for one, stores its save plans in the
    metadata).

    Raises (from ``read_metadata``):
        CheckpointFileError: the metadata is missing, truncated, names any other class, or is not DCP ``Metadata``
            (the message names the file).
    """

    #: ``{module: names}`` admitted on top of :data:`DCP_METADATA_GLOBALS`.
    extra_globals: ClassVar[Mapping[str, frozenset[str]]] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        path = Path(self._get_metadata_path(rank))
        allowed = _merged(DCP_METADATA_GLOBALS, self.extra_globals)
        try:
            with self.fs.create_stream(path, "rb") as handle:
                metadata = MetadataUnpickler(handle, allowed).load()
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


def _merged(*tables: Mapping[str, Iterable[str]]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for table in tables:
        for module, names in table.items():
            out[module] = out.get(module, frozenset()) | frozenset(names)
    return out


class WeightsOnlyBytes:
    """Load-planner mixin: non-tensor values read with ``torch.load(weights_only=True)`` and checked to be plain data.

    Put it before a DCP load planner (``class P(WeightsOnlyBytes, DefaultLoadPlanner)``); the planner's own
    ``load_bytes`` then receives the checked value re-saved, so its ``torch.load(weights_only=False)`` reads back
    only tensors and plain data.

    Args:
        folder: the checkpoint folder, to name the ``.distcp`` file of a refused value (``None``: the value's key
            and the file's name relative to the checkpoint).
        *args, **kwargs: the planner's own.

    Raises (from ``load_bytes``, wrapped by DCP in a ``CheckpointException``: see :func:`run_dcp_load`):
        CheckpointFileError: a value torch's weights-only loader refuses or that is not plain data; names the file
            and the key.
    """

    def __init__(self, *args: Any, folder: str | os.PathLike[str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.checkpoint_folder = None if folder is None else Path(folder)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = getattr(getattr(read_item, "dest_index", None), "fqn", "?")
        try:
            loaded = torch.load(value, weights_only=True)
            check_plain_data(loaded, repr(fqn))
        except Exception as exc:  # UnpicklingError (refused global), TypeError (an object), RuntimeError (bad zip)
            raise CheckpointFileError(
                self._file_of(read_item), f"the non-tensor value {fqn!r} is not plain data: {exc}"
            ) from exc
        buffer = io.BytesIO()
        torch.save(loaded, buffer)
        buffer.seek(0)
        super().load_bytes(read_item, buffer)  # type: ignore[misc]

    def _file_of(self, read_item: Any) -> Path:
        storage = getattr(getattr(self, "metadata", None), "storage_data", None) or {}
        info = storage.get(getattr(read_item, "storage_index", None)) if isinstance(storage, Mapping) else None
        relative = getattr(info, "relative_path", None)
        if relative is None:
            return Path(str(getattr(getattr(read_item, "dest_index", None), "fqn", "?")))
        return self.checkpoint_folder / relative if self.checkpoint_folder is not None else Path(relative)


_T = TypeVar("_T")


def run_dcp_load(reader: SafeFileSystemReader, call: Callable[[], _T]) -> _T:
    """Run the DCP load ``call`` that reads through ``reader``, so that a refusal comes out as itself.

    ``reader``'s metadata is read first: torch's loader, when the checkpoint's ``.metadata`` fails to read, falls
    back to per-rank ``__<rank>.metadata`` files and folds both failures into an ``AssertionError`` text. Then every
    failure inside DCP is a ``CheckpointException`` (a ``BaseException`` that ``except Exception`` and the CLI would
    not catch); a :class:`CheckpointFileError` raised inside it on any rank is raised as itself.

    Raises:
        CheckpointFileError: what the reader or the planner refused (names the file).
    """
    from torch.distributed.checkpoint.api import CheckpointException

    reader.read_metadata()
    try:
        return call()
    except CheckpointException as exc:
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, CheckpointFileError):
                raise inner from exc
        raise
