"""Merging helpers for the three DataProto fields (tensor batch, non-tensor batch, meta_info).

Follows ``union_tensor_dict``, ``union_numpy_dict``, ``verl.utils.py_functional.union_two_dict`` and the
meta_info merge inside ``DataProto.concat`` of verl/protocol.py, with the assertions replaced by
:class:`~verl.protocol.errors.DataProtoConflictError` (a ``ValueError`` and, like verl's
``assert``, an ``AssertionError``) naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from tensordict import TensorDictBase

from verl.protocol.equality import arrays_equal, deep_equal, tensors_equal
from verl.protocol.errors import DataProtoConflictError, DataProtoTypeError

__all__ = [
    "METRICS_KEY",
    "list_of_dict_to_dict_of_list",
    "merge_meta_info",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
]

#: meta_info key whose values are gathered (not required to agree) when DataProtos are concatenated.
METRICS_KEY = "metrics"
#: meta_info key of per-stage wall times (seconds); concatenation keeps the slowest part's value.
TIMING_KEY = "timing"


def union_tensor_dict(tensor_dict1: TensorDictBase, tensor_dict2: TensorDictBase) -> TensorDictBase:
    """Add the keys of ``tensor_dict2`` to ``tensor_dict1`` in place and return ``tensor_dict1``.

    Both must have the same ``batch_size``; a key present in both must hold equal tensors (same dtype,
    shape and values). All checks run before anything is written, so a failure leaves ``tensor_dict1``
    unchanged. Follows verl/protocol.py ``union_tensor_dict``.

    Raises:
        DataProtoConflictError (ValueError, AssertionError): batch sizes differ, or a shared key holds
            different tensors (the key is named).
    """
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise DataProtoConflictError(
            f"cannot union TensorDicts with batch sizes {tuple(tensor_dict1.batch_size)} and "
            f"{tuple(tensor_dict2.batch_size)}; both sides must have the same number of rows"
        )
    own_keys = set(tensor_dict1.keys(include_nested=True, leaves_only=True))
    new_items = []
    for key, value in tensor_dict2.items(include_nested=True, leaves_only=True):
        if key in own_keys:
            if not tensors_equal(tensor_dict1.get(key), value):
                raise DataProtoConflictError(
                    f"batch[{key!r}] differs between the two DataProtos being unioned; rename or pop one of them "
                    "before union"
                )
        else:
            new_items.append((key, value))
    for key, value in new_items:
        tensor_dict1.set(key, value)
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: Mapping[str, np.ndarray]) -> dict:
    """Add the arrays of ``tensor_dict2`` to ``tensor_dict1`` in place and return ``tensor_dict1``.

    A key present in both must hold equal arrays (dtype, shape, values; NaN == NaN; object arrays compared
    element-wise). Checked before writing. Follows verl/protocol.py ``union_numpy_dict``.

    Raises:
        DataProtoTypeError: a value is not a ``np.ndarray``.
        DataProtoConflictError (ValueError, AssertionError): a shared key holds different arrays (named).
    """
    for key, value in tensor_dict2.items():
        if not isinstance(value, np.ndarray):
            raise DataProtoTypeError(f"non_tensor_batch[{key!r}] must be a np.ndarray, got {type(value).__name__}")
        if key in tensor_dict1 and not arrays_equal(tensor_dict1[key], value):
            raise DataProtoConflictError(
                f"non_tensor_batch[{key!r}] differs between the two DataProtos being unioned; rename or pop one "
                "of them before union"
            )
    tensor_dict1.update(tensor_dict2)
    return tensor_dict1


def union_two_dict(dict1: dict, dict2: Mapping) -> dict:
    """Add the items of ``dict2`` to ``dict1`` in place; shared keys must hold equal values (deep compare).

    Follows verl/utils/py_functional.py ``union_two_dict``.

    Raises:
        DataProtoConflictError (ValueError, AssertionError): a shared key holds different values (the key
            and both values are named).
    """
    for key, value in dict2.items():
        if key in dict1 and not deep_equal(dict1[key], value):
            raise DataProtoConflictError(
                f"meta_info[{key!r}] conflicts: {_short(dict1[key])} vs {_short(value)}; make them agree or drop one"
            )
    dict1.update(dict2)
    return dict1


def list_of_dict_to_dict_of_list(list_of_dict: Iterable[Mapping]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2, "b": 3}]`` -> ``{"a": [1, 2], "b": [3]}`` (union of keys, first-seen order).

    verl's version asserts that later dicts only use keys of the first; here keys may differ per dict.
    """
    output: dict[str, list] = {}
    for item in list_of_dict:
        for key, value in item.items():
            output.setdefault(key, []).append(value)
    return output


def merge_meta_info(meta_infos: Iterable[Mapping], where: str = "concat") -> dict:
    """Merge the meta_info of DataProtos being concatenated (follows ``DataProto.concat`` in verl/protocol.py).

    Rules:
      * ``meta_info["metrics"]`` is gathered from every part into one ``dict[str, list]``. A part's metrics
        may be a dict or a list of dicts (``None`` is skipped). For each metric, a list value is *extended*
        and any other value is *appended*, so ``{"loss": 0.1}`` + ``{"loss": 0.2}`` gives
        ``{"loss": [0.1, 0.2]}`` and ``{"loss": [0.1, 0.2]}`` + ``{"loss": [0.3]}`` gives
        ``{"loss": [0.1, 0.2, 0.3]}`` (verl would nest the latter as ``[[0.1, 0.2], [0.3]]``). The key is
        present in the result iff some part has non-``None`` metrics.
      * ``meta_info["timing"]`` (``{stage: seconds}``, wall time of parts that ran in parallel on
        different ranks) keeps each stage's maximum: the slowest rank is the stage's wall time.
      * Every other key is taken from the parts that have it; all of them must agree (:func:`deep_equal`).

    Raises:
        DataProtoConflictError (ValueError, AssertionError): a non-metrics key has conflicting values
            (names the key and the part index).
        DataProtoTypeError: a part's metrics are neither a dict, a list of dicts nor ``None``.
    """
    merged: dict[str, Any] = {}
    origin: dict[str, int] = {}
    metrics: dict[str, list] | None = None
    for index, meta in enumerate(meta_infos):
        for key, value in meta.items():
            if key == METRICS_KEY:
                if value is not None:
                    metrics = {} if metrics is None else metrics
                    _gather_metrics(metrics, value, index, where)
            elif key == TIMING_KEY and isinstance(value, Mapping) and isinstance(merged.get(key, {}), Mapping):
                timing = dict(merged.get(key, {}))
                for stage, seconds in value.items():
                    timing[stage] = max(timing[stage], seconds) if stage in timing else seconds
                merged[key] = timing
            elif key not in merged:
                merged[key] = value
                origin[key] = index
            elif not deep_equal(merged[key], value):
                raise DataProtoConflictError(
                    # Opens with verl's wording, which verl's tests match on.
                    f"Conflicting values for meta_info key {key!r} in {where}: part {origin[key]} has "
                    f"{_short(merged[key])}, part {index} has {_short(value)}; only meta_info['metrics'] is merged, "
                    "other keys must agree"
                )
    if metrics is not None:
        merged[METRICS_KEY] = metrics
    return merged


def _gather_metrics(into: dict[str, list], value: Any, index: int, where: str) -> None:
    dicts = value if isinstance(value, list | tuple) else [value]
    for item in dicts:
        if not isinstance(item, Mapping):
            raise DataProtoTypeError(
                f"{where}: meta_info['metrics'] of part {index} must be a dict or a list of dicts, "
                f"got {type(item).__name__}"
            )
        for name, metric in item.items():
            bucket = into.setdefault(name, [])
            if isinstance(metric, list):
                bucket.extend(metric)
            else:
                bucket.append(metric)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
