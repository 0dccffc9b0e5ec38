"""Reading verl-fsdp's ``torch.distributed.checkpoint`` (DCP) folders without unpickling arbitrary objects.

The reader and the planner rule are core's (:mod:`verl.engines.safe_dcp`): ``.metadata`` through an allow-list
unpickler (DCP's metadata classes, ``torch.Size``, dtypes, layouts, paths), non-tensor values through torch's
weights-only loader and a plain-data check. Here are the two loads this engine does with them: into a template
(resume) and of chosen keys without one (``verl export``). What is refused raises
:class:`~verl.engines.safe_files.CheckpointFileError` naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner

from verl.engines.safe_dcp import SafeFileSystemReader, WeightsOnlyBytes, run_dcp_load

__all__ = ["SafeFileSystemReader", "WeightsOnlyEmptyPlanner", "WeightsOnlyLoadPlanner", "load", "load_keys"]


class WeightsOnlyLoadPlanner(WeightsOnlyBytes, DefaultLoadPlanner):
    """``DefaultLoadPlanner`` reading non-tensor values with ``torch.load(weights_only=True)`` (``folder=``: the
    checkpoint folder, named in a refusal)."""


class WeightsOnlyEmptyPlanner(WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """The planner of a load without a template (``verl export``), with the same weights-only rule."""


def load(state: dict[str, Any], folder: str | Path) -> None:
    """``dcp.load(state, folder)`` (collective when a process group exists) with the safe reader and planner.

    Raises:
        CheckpointFileError: unsafe or unreadable metadata or values (names the file and the key).
    """
    import torch.distributed.checkpoint as dcp

    reader = SafeFileSystemReader(str(folder))
    run_dcp_load(reader, lambda: dcp.load(state, storage_reader=reader, planner=WeightsOnlyLoadPlanner(folder=folder)))


def load_keys(folder: str | Path, keys: set[str]) -> dict[str, Any]:
    """Read only ``keys`` of a DCP folder into new tensors, in this one process (no process group), safely.

    Raises:
        CheckpointFileError: unsafe or unreadable metadata or values (names the file and the key).
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    reader = SafeFileSystemReader(str(folder))
    run_dcp_load(
        reader,
        lambda: _load_state_dict(
            state_dict=state,
            storage_reader=reader,
            process_group=None,
            no_dist=True,
            planner=WeightsOnlyEmptyPlanner(keys=keys, folder=folder),
        ),
    )
    return state
