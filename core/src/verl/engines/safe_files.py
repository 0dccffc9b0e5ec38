"""Checkpoint files that are data, never code: safetensors for weights, ``torch.load(weights_only=True)`` for
optimizer state, JSON for everything else; every error names the file.

A pickle (``torch.load(weights_only=False)``) runs whatever its bytes say when it is loaded, so a file planted in a
checkpoint folder (by model-written code, a shared disk, a downloaded checkpoint) would run as the trainer at the
next resume. Nothing here unpickles arbitrary objects: safetensors files hold raw tensors and a JSON header,
torch's weights-only loader rebuilds only tensors, containers and plain values, and JSON is JSON.

Also here: the plain-data check (:func:`check_plain_data`), the non-finite scan of loaded state
(:func:`nonfinite_tensors`, :func:`optimizer_tensors`, :func:`engine_nonfinite_state`) and the checkpoint error
classes shared by the engines, the workers and the trainer (the lower layer owns them so that the engines can raise
them; :mod:`verl.trainer.checkpoint` re-exports them). DCP files: :mod:`verl.engines.safe_dcp`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CONVERT_COMMAND",
    "CheckpointError",
    "CheckpointFileError",
    "LegacyCheckpointError",
    "NonFiniteCheckpointError",
    "check_plain_data",
    "engine_nonfinite_state",
    "load_tensors",
    "load_weights_only",
    "nonfinite_tensors",
    "optimizer_tensors",
    "read_json",
    "save_tensors",
    "save_weights_only",
    "write_json",
]

#: The command that rewrites a checkpoint of the pickle format (named in every refusal of one).
CONVERT_COMMAND = "verl checkpoint convert"

# safetensors' metadata is str -> str; tied parameters (one storage, several names) are stored once and the other
# names listed here as {alias: stored name}.
_ALIASES_KEY = "verl_aliases"


class CheckpointError(Exception):
    """Base class of checkpoint errors."""


class CheckpointFileError(CheckpointError, ValueError):
    """A checkpoint file is missing, truncated, corrupt or holds unexpected content; ``path`` names it."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"checkpoint file {os.fspath(path)}: {reason}")

    def __reduce__(self):  # crosses Ray's process boundary with its fields
        return (type(self), (self.path, self.reason))


class LegacyCheckpointError(CheckpointFileError):
    """A checkpoint written in the old pickle format (``data.pt``, ``trainer_state.pt``, ``model_*.pt``).

    Loading it would unpickle arbitrary objects; it is refused, and the message names the command that converts it
    once the user says they trust it.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str | None = None):
        text = reason or (
            "is in the old pickle format, which is not loaded because unpickling a file can run any code "
            f"written into it; if you trust this checkpoint (your own run wrote it), convert it with "
            f"`{CONVERT_COMMAND} <its global_step_N folder> --trust-pickle` and resume again"
        )
        super().__init__(path, text)


class NonFiniteCheckpointError(CheckpointError, ValueError):
    """Loaded state holds NaN/inf values; ``names`` lists the tensors, ``path`` the checkpoint part."""

    def __init__(self, path: str | os.PathLike[str], names: Iterable[str], what: str = "parameters"):
        self.path = Path(path)
        self.names = list(names)
        self.what = what
        shown = ", ".join(self.names[:8]) + (f" and {len(self.names) - 8} more" if len(self.names) > 8 else "")
        super().__init__(
            f"checkpoint {os.fspath(path)}: {what} with NaN/inf values: {shown}. Training from it would skip every "
            "update; resume from an earlier checkpoint (trainer.resume_mode=resume_path "
            "trainer.resume_from_path=<dir>/global_step_<N>) or start from scratch"
        )

    def __reduce__(self):
        return (type(self), (self.path, self.names, self.what))


# ---------------------------------------------------------------------- JSON
def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as UTF-8 JSON (``allow_nan=False``: a NaN in trainer state is a bug to surface, not to keep).

    Raises:
        ValueError: ``obj`` holds a NaN/inf float or a value JSON cannot hold (the message names ``path``).
    """
    try:
        text = json.dumps(obj, indent=1, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot write {os.fspath(path)} as JSON: {exc}") from exc
    Path(path).write_text(text + "\n", encoding="utf-8")


def read_json(path: str | os.PathLike[str], *, expect: type = dict) -> Any:
    """Read a JSON file written by :func:`write_json`.

    Raises:
        CheckpointFileError: missing, not UTF-8, not valid JSON (a truncated file), or its top level is not
            ``expect`` (the message names the file).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CheckpointFileError(path, "is missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointFileError(path, f"cannot be read: {exc}") from exc
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise CheckpointFileError(path, f"is not valid JSON (truncated or corrupt?): {exc}") from exc
    if not isinstance(value, expect):
        raise CheckpointFileError(path, f"holds a JSON {type(value).__name__}, expected a {expect.__name__}")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


# ---------------------------------------------------------------------- tensors (safetensors)
def save_tensors(path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor]) -> None:
    """Write ``{name: tensor}`` to a safetensors file (any dtype/device; copied to the CPU, made contiguous).

    Tensors that share one storage with the same shape and strides (tied embeddings) are stored once and come back
    as one tensor under every name; other overlapping views are stored as copies.

    Raises:
        TypeError: a value that is not a tensor (the message names the key).
    """
    from safetensors.torch import save_file

    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{os.fspath(path)}: value of {name!r} is a {type(tensor).__name__}, not a tensor")
        tensor = tensor.detach()
        if hasattr(tensor, "full_tensor"):  # a DTensor: its full value (a sharded engine writes its own format)
            tensor = tensor.full_tensor()
        ptr = tensor.untyped_storage().data_ptr() if tensor.numel() else None
        key = (ptr, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if ptr is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if ptr is not None and ptr in storages:
            tensor = tensor.clone()  # a different view of a stored storage: safetensors refuses shared memory
        elif ptr is not None:
            seen[key] = name
            storages.add(ptr)
        stored[name] = tensor.to("cpu").contiguous()
    metadata = {_ALIASES_KEY: json.dumps(aliases, sort_keys=True)} if aliases else None
    save_file(stored, os.fspath(path), metadata=metadata)


def load_tensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a file written by :func:`save_tensors` onto the CPU (tied names restored as one tensor).

    Raises:
        CheckpointFileError: missing, truncated or corrupt file, or a bad alias table (the message names it).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointFileError(path, "is missing")
    try:
        with safe_open(os.fspath(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 - not a dict
    except Exception as exc:  # safetensors raises its own SafetensorError, OSError, ValueError...
        raise CheckpointFileError(path, f"is not a readable safetensors file (truncated or corrupt?): {exc}") from exc
    if _ALIASES_KEY in metadata:
        try:
            aliases = json.loads(metadata[_ALIASES_KEY])
            for alias, target in aliases.items():
                tensors[str(alias)] = tensors[target]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointFileError(path, f"has a bad {_ALIASES_KEY} table in its header: {exc!r}") from exc
    return tensors


# ---------------------------------------------------------------------- weights-only torch files
def save_weights_only(path: str | os.PathLike[str], obj: Any) -> None:
    """``torch.save`` of tensors / containers / plain values (optimizer and LR-scheduler state dicts), readable by
    :func:`load_weights_only`. Refuses anything the weights-only loader could not read back.

    Raises:
        TypeError: ``obj`` holds an object other than tensors, dicts, lists, tuples and plain values.
    """
    check_plain_data(obj, os.fspath(path))
    torch.save(obj, os.fspath(path))


def load_weights_only(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True, map_location="cpu")``: tensors, containers and plain values only.

    Raises:
        CheckpointFileError: missing, truncated or corrupt file, or one that holds other objects (a pickle that
            would need the unsafe loader); the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointFileError(path, "is missing")
    try:
        return torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError (refused object), RuntimeError (bad zip), EOFError...
        raise CheckpointFileError(
            path, f"cannot be read with torch's weights-only loader (truncated, corrupt, or not data only): {exc}"
        ) from exc


def check_plain_data(obj: Any, where: str) -> None:
    """Check that ``obj`` is plain data: tensors, dtypes, ``torch.Size``, ``None``, bool/int/float/str/bytes, and
    dicts, lists and tuples of those (what torch's weights-only loader rebuilds without any allow-list widening).

    Args:
        obj: the value to check.
        where: what holds it (a file, a key), named in the error.

    Raises:
        TypeError: ``obj`` holds anything else; names ``where`` and the key path of the offending value.
    """
    _check_plain(obj, where, "")


def _check_plain(obj: Any, where: str, key: str) -> None:
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.Size)):
        return
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _check_plain(v, where, f"{key}.{k}" if key else str(k))
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_plain(v, where, f"{key}[{i}]")
        return
    raise TypeError(f"{where}: {key or 'the value'} is a {type(obj).__name__}; only tensors and plain data are allowed")


# ---------------------------------------------------------------------- non-finite scan
def nonfinite_tensors(named: Iterable[tuple[str, Any]]) -> list[str]:
    """Names of the floating-point tensors (or float scalars) in ``named`` holding a NaN or inf.

    A DTensor is checked on this rank's shard (every rank checks its own). Integer tensors are never non-finite.
    """
    bad = []
    for name, value in named:
        if isinstance(value, float):
            if not math.isfinite(value):
                bad.append(name)
            continue
        if not isinstance(value, torch.Tensor):
            continue
        local = value.to_local() if hasattr(value, "to_local") else value
        if (local.is_floating_point() or local.is_complex()) and local.numel() and not _all_finite(local.detach()):
            bad.append(name)
    return bad


def _all_finite(tensor: torch.Tensor) -> bool:
    # A NaN or inf anywhere makes the sum NaN or inf, and a sum is one memory-bound pass (measured 5 GB/s on the
    # 2-vCPU dev box against 0.3 GB/s for isfinite().all(), which writes a bool tensor first). A non-finite sum
    # may also be an overflow of finite values: only then is the exact test run.
    total = complex(tensor.sum()) if tensor.is_complex() else float(tensor.sum())
    if math.isfinite(abs(total)):
        return True
    return bool(torch.isfinite(tensor).all())


def optimizer_tensors(optimizer: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``(name, value)`` of a ``torch.optim.Optimizer``'s per-parameter state (moments, step counts), named
    ``{prefix}group{g}.param{p}.{key}`` by the parameter's place in ``param_groups``."""
    names = {}
    for gi, group in enumerate(getattr(optimizer, "param_groups", [])):
        for pi, param in enumerate(group.get("params", [])):
            names[id(param)] = f"{prefix}group{gi}.param{pi}"
    for param, state in getattr(optimizer, "state", {}).items():
        if isinstance(state, Mapping):
            for key, value in state.items():
                yield f"{names.get(id(param), prefix + '?')}.{key}", value


def engine_nonfinite_state(engine: Any) -> tuple[list[str], list[str]]:
    """``(parameter names, optimizer-state names)`` of ``engine`` holding NaN/inf, on this rank.

    An engine that defines ``nonfinite_state()`` answers itself (verl-megatron: its optimizer is Megatron's, not a
    ``torch.optim.Optimizer``). Otherwise looks at ``engine.model`` for the module and at ``engine.optimizer`` when
    it is a ``torch.optim.Optimizer`` (the reference and FSDP engines); an engine exposing neither gives ``([], [])``.
    Costs one summing pass over the weights and the optimizer moments (about 5 GB/s on the 2-vCPU dev box).
    """
    own = getattr(engine, "nonfinite_state", None)
    if callable(own):
        params, optim = own()
        return list(params), list(optim)
    module = getattr(engine, "model", None)
    params = nonfinite_tensors(module.named_parameters()) if isinstance(module, torch.nn.Module) else []
    optimizer = getattr(engine, "optimizer", None)
    optim = nonfinite_tensors(optimizer_tensors(optimizer)) if isinstance(optimizer, torch.optim.Optimizer) else []
    return params, optim
