"""Pickle support for DataProto (Ray ships DataProtos between processes with pickle).

Follows ``DataProto.__getstate__`` / ``__setstate__`` in verl/protocol.py: the TensorDict travels as
``torch.save`` bytes and is loaded onto the CPU when the receiving process has no accelerator.
Two differences: (1) tensors that are views into a larger storage (every ``chunk``/``split``/slice
piece) are compacted first, otherwise ``torch.save`` writes the *whole* parent storage for every piece;
(2) loading uses ``weights_only=True``, which only ever rebuilds tensors, dicts and plain values.
Non-tensor arrays and meta_info go through ordinary pickle, so object arrays and dtypes round-trip.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["STATE_VERSION", "decode_batch", "encode_batch"]

STATE_VERSION = 1


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    needed = tensor.numel() * tensor.element_size()
    if tensor.untyped_storage().nbytes() > needed:
        return tensor.clone()
    return tensor


def encode_batch(batch: TensorDictBase | None) -> bytes | None:
    """Serialize a TensorDict (nested keys allowed) to bytes; ``None`` stays ``None``."""
    if batch is None:
        return None
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


def decode_batch(data: bytes | None) -> TensorDict | None:
    """Inverse of :func:`encode_batch`; tensors land on the CPU when this process has no accelerator."""
    if data is None:
        return None
    map_location: Any = None if _accelerator_available() else "cpu"
    payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    device = payload["device"]
    if device is not None and map_location == "cpu":
        device = "cpu"
    return TensorDict(payload["tensors"], batch_size=payload["batch_size"], device=device)
