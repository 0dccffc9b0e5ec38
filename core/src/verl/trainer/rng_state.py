"""RNG state of a run (python ``random``, numpy, torch CPU and the accelerator), saved in ``trainer_state.json``.

Kept apart from :mod:`verl.trainer.checkpoint` (which re-exports both functions) so the checkpoint protocol
module stays about files. In a checkpoint the state is JSON (:func:`rng_state_to_json`): python's and numpy's as
lists of ints, torch's byte tensors (CPU and each device) as base64 text, never a pickle.
"""

from __future__ import annotations

import base64
import binascii
import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state", "rng_state_from_json", "rng_state_to_json"]

logger = logging.getLogger("verl.trainer.checkpoint")


def capture_rng_state(platform: Any = None) -> dict[str, Any]:
    """RNG state of python ``random``, numpy's global generator, torch CPU and (if any) the accelerator.

    Args:
        platform: a ``verl.platform.Platform``; ``None`` -> ``verl.plugins.current_platform()``. Device RNG
            goes through ``platform.device_module`` (``torch.cuda``, ``torch.npu``, ...), never ``torch.cuda``
            directly; it is skipped on CPU or when ``verl.platform`` is not importable.

    Returns:
        ``{"python": random.getstate(), "numpy": {bit_generator, key (list of 624 ints), pos, has_gauss,
        cached_gaussian}, "torch_cpu": ByteTensor, "device"?: {"device_type", "states": [ByteTensor per
        device]}}`` — only primitives and tensors, so ``torch.load(weights_only=True)`` reads it back.
    """
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = {"bit_generator": str(name), "key": key.tolist(), "pos": int(pos), "has_gauss": int(has_gauss)}
    numpy_state["cached_gaussian"] = float(cached)
    state: dict[str, Any] = {"python": random.getstate(), "numpy": numpy_state, "torch_cpu": torch.get_rng_state()}
    platform, module = _device_rng_module(platform)
    if module is not None:
        state["device"] = {"device_type": platform.device_type, "states": list(module.get_rng_state_all())}
    return state


def restore_rng_state(state: Mapping[str, Any], platform: Any = None) -> None:
    """Restore what :func:`capture_rng_state` captured (same ``platform`` rule).

    A device state saved on another device type, or here without an accelerator, is skipped with a warning;
    with a different device count, the common devices are restored (warning).

    Raises:
        KeyError: ``python``, ``numpy`` or ``torch_cpu`` missing (the message lists the keys present).
    """
    missing = [k for k in ("python", "numpy", "torch_cpu") if k not in state]
    if missing:
        raise KeyError(f"RNG state lacks {missing}; got keys {sorted(state)} (expected capture_rng_state() output)")
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    nps = state["numpy"]
    key = np.asarray(nps["key"], dtype=np.uint32)
    np.random.set_state((nps["bit_generator"], key, int(nps["pos"]), int(nps["has_gauss"]), nps["cached_gaussian"]))
    torch.set_rng_state(torch.as_tensor(state["torch_cpu"], dtype=torch.uint8).cpu())
    device = state.get("device")
    if device is None:
        return
    platform, module = _device_rng_module(platform)
    if module is None or platform.device_type != device["device_type"]:
        here = "no accelerator" if module is None else platform.device_type
        logger.warning("not restoring %s RNG state: this process has %s", device["device_type"], here)
        return
    saved = list(device["states"])
    count = module.device_count()
    if count != len(saved):
        logger.warning("RNG state saved for %d %s devices, %d visible now", len(saved), device["device_type"], count)
    for index, rng in enumerate(saved[:count]):
        module.set_rng_state(torch.as_tensor(rng, dtype=torch.uint8).cpu(), index)


def _device_rng_module(platform: Any) -> tuple[Any, Any]:
    if platform is None:
        try:
            from verl.plugins import current_platform
        except ImportError:
            return None, None
        platform = current_platform()
    module = platform.device_module
    if module is None or not hasattr(module, "get_rng_state_all") or not module.is_available():
        return platform, None
    return platform, module


def _b64(tensor: Any) -> str:
    return base64.b64encode(torch.as_tensor(tensor, dtype=torch.uint8).cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: Any, field: str) -> torch.Tensor:
    if not isinstance(text, str):
        raise ValueError(f"RNG state field {field!r} must be base64 text, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"RNG state field {field!r} is not valid base64: {exc}") from exc
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def rng_state_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`capture_rng_state` output as JSON-ready data: ``{"python": [version, [ints], gauss_next],
    "numpy": {...}, "torch_cpu": base64, "device"?: {"device_type", "states": [base64, ...]}}``."""
    version, internal, gauss_next = state["python"]
    out: dict[str, Any] = {
        "python": [int(version), [int(v) for v in internal], gauss_next],
        "numpy": dict(state["numpy"]),
        "torch_cpu": _b64(state["torch_cpu"]),
    }
    device = state.get("device")
    if device is not None:
        out["device"] = {"device_type": str(device["device_type"]), "states": [_b64(t) for t in device["states"]]}
    return out


def rng_state_from_json(value: Any) -> dict[str, Any]:
    """Inverse of :func:`rng_state_to_json`: the mapping :func:`restore_rng_state` takes.

    Raises:
        ValueError: a missing field or one of the wrong type / encoding (the message names the field).
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"RNG state must be a JSON object, got {type(value).__name__}")
    missing = [k for k in ("python", "numpy", "torch_cpu") if k not in value]
    if missing:
        raise ValueError(f"RNG state lacks {missing}; got keys {sorted(value)}")
    python = value["python"]
    ok = isinstance(python, list) and len(python) == 3 and isinstance(python[1], list)
    if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in [python[0], *python[1]]):
        raise ValueError("RNG state field 'python' must be [version, [ints], gauss_next]")
    if python[2] is not None and not isinstance(python[2], (int, float)):
        raise ValueError("RNG state field 'python' has a gauss_next that is neither null nor a number")
    nps = value["numpy"]
    keys = ("bit_generator", "key", "pos", "has_gauss", "cached_gaussian")
    if not isinstance(nps, Mapping) or any(k not in nps for k in keys) or not isinstance(nps["key"], list):
        raise ValueError(f"RNG state field 'numpy' must hold {list(keys)} with 'key' a list of ints")
    out: dict[str, Any] = {
        "python": (python[0], tuple(python[1]), python[2]),
        "numpy": dict(nps),
        "torch_cpu": _unb64(value["torch_cpu"], "torch_cpu"),
    }
    device = value.get("device")
    if device is not None:
        if not isinstance(device, Mapping) or not isinstance(device.get("states"), list):
            raise ValueError("RNG state field 'device' must be {'device_type', 'states': [base64, ...]}")
        states = [_unb64(t, f"device.states[{i}]") for i, t in enumerate(device["states"])]
        out["device"] = {"device_type": str(device.get("device_type")), "states": states}
    return out
