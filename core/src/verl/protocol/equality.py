"""Value equality used by ``union`` and ``concat`` to decide whether two values "agree".

Follows ``_deep_equal`` / ``_array_equal`` in verl/protocol.py (NaN equals NaN, object arrays compared
element by element, reference cycles terminate), extended to torch tensors, dicts, lists and tuples so
that meta_info values such as ``{"temperature": torch.tensor(1.0)}`` compare without the ambiguous-truth
error that ``==`` on arrays would raise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["arrays_equal", "deep_equal", "tensors_equal"]


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same dtype and shape and equal values (NaN == NaN).

    Tensors on different devices are compared on ``a``'s device.
    """
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.device != b.device:
        b = b.to(a.device)
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a, b) or torch.all((a == b) | (torch.isnan(a) & torch.isnan(b))).item())
    return torch.equal(a, b)


def arrays_equal(a: np.ndarray, b: np.ndarray, _visited: set[int] | None = None) -> bool:
    """True when two numpy arrays have the same dtype and shape and equal elements (NaN == NaN).

    Object arrays are compared element-wise with :func:`deep_equal`; a vectorised ``==`` is tried first
    because it settles the common case (strings, numbers) without a Python loop over rows.
    """
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype != object:
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    try:
        fast = np.equal(a, b)
        if isinstance(fast, np.ndarray) and fast.dtype == bool and fast.all():
            return True
    except (ValueError, TypeError):
        # Elements such as nested arrays make `==` ambiguous; fall through to the exact comparison.
        pass
    visited = set() if _visited is None else _visited
    return all(deep_equal(x, y, visited) for x, y in zip(a.flat, b.flat, strict=True))


def deep_equal(a: Any, b: Any, _visited: set[int] | None = None) -> bool:
    """Recursive equality: same type, NaN == NaN, arrays/tensors by value, containers element-wise.

    Follows verl/protocol.py ``_deep_equal``: values of different types are unequal (``1`` vs ``1.0``
    included) and a container already being compared on the current path counts as equal (cycles).
    """
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    visited = set() if _visited is None else _visited
    key = id(a)
    if key in visited:
        return True
    visited.add(key)
    try:
        if isinstance(a, float):
            return (math.isnan(a) and math.isnan(b)) or a == b
        if isinstance(a, np.ndarray):
            return arrays_equal(a, b, visited)
        if isinstance(a, torch.Tensor):
            return tensors_equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(deep_equal(a[k], b[k], visited) for k in a)
        if isinstance(a, list | tuple):
            return len(a) == len(b) and all(deep_equal(x, y, visited) for x, y in zip(a, b, strict=True))
        result = a == b
        return bool(result) if isinstance(result, bool | np.bool_) else bool(np.all(result))
    finally:
        visited.discard(key)
