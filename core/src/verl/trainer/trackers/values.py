"""Value conversions shared by the tracking backends: JSON-safe values, loggable scalars, flat params."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any

import numpy as np


def to_json_safe(value: Any) -> Any:
    """Plain JSON types: numpy/torch scalars -> python numbers, arrays/tensors -> lists, NaN/inf -> ``None``,
    mapping keys -> str, anything else -> ``str(value)``."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_safe(v) for v in value]
    if hasattr(value, "tolist") and hasattr(value, "ndim"):  # numpy / torch, scalar or not
        return to_json_safe(value.tolist())
    return str(value)


def scalar(value: Any) -> float | None:
    """A loggable number (python float), or ``None`` for text, containers and multi-element arrays.

    Accepts bool, int, float, numpy scalars and 0-d numpy arrays / torch tensors. NaN and inf pass
    through unchanged: each backend decides how to store them.
    """
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float, np.number)):
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return scalar(value.item())
    return None


def scalars(data: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``data`` that :func:`scalar` turns into numbers (text and arrays left out)."""
    out = {}
    for key, value in data.items():
        number = scalar(value)
        if number is not None:
            out[str(key)] = number
    return out


def flatten_params(config: Mapping[str, Any] | None, sep: str = "/") -> dict[str, Any]:
    """A nested config as one flat ``{"trainer/total_epochs": 1, ...}`` mapping (MLflow params).

    As verl's ``_compute_mlflow_params_from_objects`` (verl/utils/tracking.py): nested keys joined
    with ``sep``; a list becomes ``{"list_len": n, "0": item0, "1": item1, ...}`` so each item is one
    param (an empty list: ``{"list_len": 0}``); paths become str, enums their value; an empty mapping
    is kept as one ``{}`` param rather than vanishing. ``None`` gives ``{}``.
    """
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Enum):
            value = value.value
        if isinstance(value, PurePath):
            value = str(value)
        if isinstance(value, (list, tuple)):
            value = {"list_len": len(value), **{str(i): v for i, v in enumerate(value)}}
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(f"{prefix}{sep}{key}" if prefix else str(key), item)
        elif prefix:
            out[prefix] = value

    walk("", config or {})
    return out
