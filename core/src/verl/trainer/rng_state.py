"""RNG state of a run (python ``random``, numpy, torch CPU and the accelerator), saved in ``trainer_state.pt``.

Kept apart from :mod:`verl.trainer.checkpoint` (which re-exports both functions) so the checkpoint protocol
module stays about files.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]

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
