"""Weight-update buckets as TensorRT-LLM's worker extension receives them: CUDA IPC handles, keyed by GPU UUID.

TensorRT-LLM's ``tensorrt_llm/llmapi/rlhf_utils.py`` ``WorkerExtension.update_weights(ipc_handles)`` (the base of
:class:`verl_trtllm.worker_extension.VerlWorkerExtension`) takes ``{device_uuid: payload}``; the payload is the
base64 text of a pickled ``[(hf_name, (rebuild_fn, args)), ...]`` list (decoded with TensorRT-LLM's restricted
unpickler, which admits builtins and ``torch.*``), each handle from
``torch.multiprocessing.reductions.reduce_tensor`` of a CUDA tensor; the worker replaces ``args[6]`` (the device
index) by its own, rebuilds the tensors and loads them with ``model_loader.reload(model, weights,
allow_partial_loading=True)``. ``update_weights(None)`` then finalises: post-load processing of every module and a
prefix-cache reset. verl's ``ServerAdapter.update_weights`` sends the same, bucket by bucket.

Each tensor is copied onto the GPU as it arrives (:func:`stage_stream`), before the sender is asked for the next one,
and the tensors behind the handles must stay alive until the worker has loaded them (the RPC returns): the engine
keeps each staged bucket until its call returns.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch


def stage_stream(
    weights: Iterable[tuple[str, torch.Tensor]], device: torch.device, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, copy)`` for each pair of ``weights``: a fresh, contiguous copy on ``device``, floating tensors cast
    to ``dtype``, made before the next pair is asked for.

    A copy is always made, even when a tensor is already there in that dtype: the sender may reuse its buffers once
    asked for the next tensor (``verl.engines.base.RolloutEngine.update_weights``), and TensorRT-LLM's worker reads
    the memory only when the whole bucket is handed over.

    Args:
        weights: ``(hf_name, tensor)`` pairs of full tensors, any device.
        device: where TensorRT-LLM's worker can open the memory (this process's GPU).
        dtype: the engine's dtype; integer/bool tensors keep theirs.
    """
    for name, tensor in weights:
        target = dtype if tensor.is_floating_point() else tensor.dtype
        staged = torch.empty(tuple(tensor.shape), dtype=target, device=device)
        staged.copy_(tensor.detach())
        yield name, staged


def ipc_payload(
    staged: Iterable[tuple[str, torch.Tensor]], device_uuid: str, reduce_tensor: Callable[[torch.Tensor], Any]
) -> dict[str, str]:
    """``{device_uuid: base64(pickle([(name, reduce_tensor(t)), ...]))}``, TensorRT-LLM's ``update_weights`` input.

    Args:
        staged: ``(hf_name, tensor)`` pairs on the GPU the worker runs on (:func:`stage_stream`).
        device_uuid: that GPU's UUID as TensorRT-LLM's ``get_device_uuid`` spells it (the worker's lookup key).
        reduce_tensor: ``torch.multiprocessing.reductions.reduce_tensor``.
    """
    handles = [(name, reduce_tensor(tensor)) for name, tensor in staged]
    return {device_uuid: base64.b64encode(pickle.dumps(handles)).decode("ascii")}


def decode_payload(payload: dict[str, str], device_uuid: str) -> list[tuple[str, Any]]:
    """The ``[(name, handle), ...]`` list of :func:`ipc_payload` for ``device_uuid`` (what the worker unpickles).

    Plain ``pickle`` here, for tests and diagnostics in this process; TensorRT-LLM's worker uses its restricted
    unpickler on the same bytes.

    Raises:
        KeyError: no entry for ``device_uuid``.
    """
    return pickle.loads(base64.b64decode(payload[device_uuid]))  # noqa: S301 (our own bytes)
