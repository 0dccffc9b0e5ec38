"""Pickle support for DataProto and verl's numpy encoding of tensors and TensorDicts.

``DataProto.__getstate__`` / ``__setstate__`` follow verl/protocol.py: by default the TensorDict travels
as ``torch.save`` bytes and is loaded onto the CPU when the receiving process has no accelerator. With
``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy`` (verl's switch) it travels as :func:`serialize_tensordict`
output instead: plain numpy byte arrays that pickle protocol 5 (Ray) ships out of band, without copying.
The receiver recognises either form by its type, so sender and receiver need not agree on the variable.

Differences from verl: (1) for ``torch.save``, tensors that are views into a larger storage (every
``chunk``/``split``/slice piece) are compacted first, otherwise ``torch.save`` writes the *whole* parent
storage for every piece; (2) loading uses ``weights_only=True``, which only ever rebuilds tensors, dicts
and plain values. Non-tensor arrays and meta_info go through ordinary pickle.

Encoding formats (same as verl's ``serialize_single_tensor`` / ``serialize_tensordict``):

* one tensor: ``(dtype, shape, data)``: ``dtype`` is the ``torch.dtype`` name without ``"torch."``
  (``"bfloat16"``), ``shape`` a ``torch.Size``, ``data`` a 1-D ``np.uint8`` array of the row-major bytes;
* a nested (jagged) tensor: ``(layout, [one-tensor encoding per component])``, ``layout`` e.g. ``"jagged"``;
* a TensorDict: ``(batch_size, device, {key: encoding})``, ``batch_size`` a tuple of ints, ``device`` a
  string or ``None``. Keys of nested TensorDicts are tuples (an extension: verl handles flat keys only).
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor

from verl.protocol.errors import DataProtoError, DataProtoTypeError

__all__ = [
    "SERIALIZATION_METHOD_ENV",
    "STATE_VERSION",
    "decode_batch",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "encode_batch",
    "serialize_single_tensor",
    "serialize_tensordict",
]

STATE_VERSION = 1
#: Environment variable (verl's name) choosing how ``DataProto`` pickles its batch: ``numpy`` or unset.
SERIALIZATION_METHOD_ENV = "VERL_DATAPROTO_SERIALIZATION_METHOD"


# ------------------------------------------------------------------------------------- verl's numpy codec
def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, torch.Size, np.ndarray]:
    """Encode a tensor as ``(dtype, shape, data)`` (follows verl/protocol.py ``serialize_single_tensor``).

    Args:
        obj: any strided tensor: any dtype (bf16, fp8, bool, complex, ...), any shape including 0-d and
            empty, contiguous or not, on any device, with or without ``requires_grad``.

    Returns:
        ``dtype``: e.g. ``"float32"``; ``shape``: ``obj.shape``; ``data``: 1-D ``np.uint8`` array of
        ``obj.numel() * obj.element_size()`` bytes in row-major order. For a contiguous CPU tensor ``data``
        shares memory with ``obj`` (as in verl): serialize after the last in-place write.

    Raises:
        DataProtoTypeError: ``obj`` is not a tensor, or is nested / sparse (use :func:`serialize_tensordict`
            for nested tensors).
    """
    if not isinstance(obj, torch.Tensor):
        raise DataProtoTypeError(f"serialize_single_tensor expects a torch.Tensor, got {type(obj).__name__}")
    if obj.is_nested or obj.layout != torch.strided:
        raise DataProtoTypeError(
            f"serialize_single_tensor handles strided tensors only, got layout {obj.layout}; nested tensors are "
            "encoded per component by serialize_tensordict"
        )
    # detach: numpy refuses tensors that require grad; cpu: numpy cannot see device memory.
    flat = obj.detach().cpu().flatten().contiguous()
    data = flat.view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), obj.shape, data


def deserialize_single_tensor(arr: Any) -> torch.Tensor:
    """Inverse of :func:`serialize_single_tensor`: a new CPU tensor that owns its memory.

    Args:
        arr: ``(dtype, shape, data)``; ``data`` may be a ``np.uint8`` array, ``bytes``, ``bytearray`` or
            ``memoryview`` (it is copied, as in verl, so the result never aliases the caller's buffer).

    Raises:
        DataProtoError: ``arr`` is not a 3-tuple, or ``data`` has the wrong number of bytes for
            ``shape`` and ``dtype``.
        DataProtoTypeError: ``dtype`` names no ``torch.dtype``.
    """
    if not isinstance(arr, tuple | list) or len(arr) != 3:
        raise DataProtoError(f"a serialized tensor is a (dtype, shape, data) tuple, got {type(arr).__name__}")
    dtype_name, shape, data = arr
    torch_dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(torch_dtype, torch.dtype):
        raise DataProtoTypeError(f"serialized tensor has unknown dtype {dtype_name!r}; expected e.g. 'bfloat16'")
    shape = torch.Size(shape)
    buffer = bytearray(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data)
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    expected = shape.numel() * itemsize
    if len(buffer) != expected:
        raise DataProtoError(
            f"serialized {dtype_name} tensor of shape {tuple(shape)} needs {expected} bytes, got {len(buffer)}"
        )
    if expected == 0:
        # torch.frombuffer refuses an empty buffer.
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(torch_dtype).view(shape)


def serialize_tensordict(batch: TensorDictBase) -> tuple[tuple[int, ...], str | None, dict[Any, tuple]]:
    """Encode a TensorDict as ``(batch_size, device, {key: encoding})`` (verl/protocol.py ``serialize_tensordict``).

    Each leaf is encoded by :func:`serialize_single_tensor`; a nested tensor as ``(layout, [component
    encodings])``. Nested TensorDicts become tuple keys such as ``("a", "b")``.

    Raises:
        DataProtoTypeError: ``batch`` is not a TensorDict, or holds non-tensor data (keep Python objects in
            ``DataProto.non_tensor_batch``).
    """
    if not isinstance(batch, TensorDictBase):
        raise DataProtoTypeError(f"serialize_tensordict expects a TensorDict, got {type(batch).__name__}")
    encoded: dict[Any, tuple] = {}
    for key, value in batch.items(include_nested=True, leaves_only=True):
        if is_non_tensor(value):
            raise DataProtoTypeError(f"serialize_tensordict: {key!r} holds non-tensor data, which has no byte encoding")
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(part) for part in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = None if batch.device is None else str(batch.device)
    return tuple(batch.batch_size), device, encoded


def deserialize_tensordict(arr: Any) -> TensorDict:
    """Inverse of :func:`serialize_tensordict`.

    The TensorDict is placed on the recorded device, except that a non-CPU device becomes ``"cpu"`` when
    this process has no accelerator (as ``DataProto`` unpickling does; verl would fail there).

    Raises:
        DataProtoError: not a ``(batch_size, device, items)`` triple, or an item is neither a 3-tuple
            (tensor) nor a 2-tuple (nested tensor), as verl's ``ValueError``.
    """
    if not isinstance(arr, tuple | list) or len(arr) != 3:
        raise DataProtoError(
            f"a serialized TensorDict is a (batch_size, device, items) tuple, got {type(arr).__name__}"
        )
    batch_size, device, encoded = arr
    decoded: dict[Any, torch.Tensor] = {}
    for key, value in encoded.items():
        if len(value) == 3:
            decoded[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, parts = value
            decoded[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(part) for part in parts], layout=getattr(torch, layout)
            )
        else:
            raise DataProtoError(f"invalid encoding of {key!r}: expected a 2- or 3-tuple, got length {len(value)}")
    if device is not None and torch.device(device).type != "cpu" and not _accelerator_available():
        device = "cpu"
    return TensorDict(decoded, batch_size=list(batch_size), device=device)


# --------------------------------------------------------------------------------------- DataProto pickle
def _compact(tensor: torch.Tensor) -> torch.Tensor:
    needed = tensor.numel() * tensor.element_size()
    if tensor.untyped_storage().nbytes() > needed:
        return tensor.clone()
    return tensor


def encode_batch(batch: TensorDictBase | None) -> bytes | tuple | None:
    """Serialize a TensorDict for pickling; ``None`` stays ``None``.

    Returns ``torch.save`` bytes, or :func:`serialize_tensordict` output when
    ``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``.

    Raises:
        DataProtoError: the variable holds any other non-empty value (names the accepted ones).
    """
    if batch is None:
        return None
    method = os.getenv(SERIALIZATION_METHOD_ENV, "")
    if method == "numpy":
        return serialize_tensordict(batch)
    if method not in ("", "torch"):
        raise DataProtoError(f"{SERIALIZATION_METHOD_ENV}={method!r} is not supported; use 'numpy' or leave it unset")
    tensors = batch.apply(_compact).to_dict()
    payload = {
        "tensors": tensors,
        "batch_size": list(batch.batch_size),
        "device": None if batch.device is None else str(batch.device),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator is not None and accelerator.is_available())


def decode_batch(data: bytes | tuple | None) -> TensorDict | None:
    """Inverse of :func:`encode_batch` (either form); tensors land on the CPU when there is no accelerator."""
    if data is None:
        return None
    if isinstance(data, tuple):
        return deserialize_tensordict(data)
    map_location: Any = None if _accelerator_available() else "cpu"
    payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    device = payload["device"]
    if device is not None and map_location == "cpu":
        device = "cpu"
    return TensorDict(payload["tensors"], batch_size=payload["batch_size"], device=device)
