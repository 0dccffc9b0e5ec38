"""Shims that let megatron-core 0.16 run on the CPU under gloo, applied only while the engine runs on the CPU.

Megatron-core assumes CUDA in a handful of places that have nothing to do with the math
(``../shared/reference/backends.md``, measured on megatron-core 0.16.1):

* ``torch.cuda.current_device()`` is used as the device of new tensors (RoPE's ``inv_freq``, the DDP
  buffers, the global memory buffer): :func:`current_device_is_cpu` makes it answer ``"cpu"``;
* the optimizer wrappers and ``clip_grads.py`` create scalars with an explicit ``device="cuda"`` and assert
  ``param.grad.type() == "torch.cuda.FloatTensor"``: :func:`cuda_tensors_on_cpu` maps explicit ``cuda``
  devices to the CPU and lets ``Tensor.type()`` report the CUDA type name, for the duration of the block;
* ``model_parallel_cuda_manual_seed`` seeds CUDA generators: :func:`init_rng_tracker` uses Megatron's own
  inference RNG tracker (its ``fork()`` is a no-op) on the CPU instead;
* activation recompute (``recompute_granularity=full``: ``enable_gradient_checkpointing``) saves and restores the
  CUDA generator's state around the recomputed forward: while :func:`current_device_is_cpu` is open,
  ``megatron.core.tensor_parallel.random``'s ``_get_cuda_rng_state`` returns the CPU generator's state and
  ``_set_cuda_rng_state`` does nothing (the CPU state itself is restored by Megatron beside it);
* ``dist_checkpointing.save`` copies the shards to host memory with ``non_blocking=True`` and then calls
  ``torch.cuda.synchronize()`` (``FileSystemWriterAsync.preload_tensors``): it does nothing while
  :func:`current_device_is_cpu` is open (CPU copies are synchronous);
* with pipeline stages and tied embeddings, ``LanguageModule.setup_embeddings_and_output_layer`` moves the shared
  weight with ``weight.data.cuda()`` before all-reducing it over the embedding group: ``Tensor.cuda`` returns
  the tensor itself while :func:`current_device_is_cpu` is open.

Every shim is a context manager entered by the engine around its own calls into Megatron and undone on exit,
so nothing else in the process (the rollout engine sharing it, the user's code) sees them. Listed in the
plugin README; tests contain none.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_LOCK = threading.RLock()
_DEPTH = 0
_SAVED: Any = None


@contextlib.contextmanager
def current_device_is_cpu(active: bool = True) -> Iterator[None]:
    """While open (and ``active``), ``torch.cuda.current_device()`` returns ``"cpu"`` (re-entrant)."""
    global _DEPTH, _SAVED
    if not active:
        yield
        return
    with _LOCK:
        if _DEPTH == 0:
            from megatron.core.tensor_parallel import random as mrandom

            _SAVED = (
                torch.cuda.current_device,
                torch.cuda.synchronize,
                torch.Tensor.cuda,
                mrandom._get_cuda_rng_state,
                mrandom._set_cuda_rng_state,
            )
            torch.Tensor.cuda = _stay_on_cpu  # type: ignore[method-assign]
            torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
            torch.cuda.synchronize = _no_cuda_rng_state  # type: ignore[assignment]  (a no-op of any arguments)
            mrandom._get_cuda_rng_state = _cpu_rng_state
            mrandom._set_cuda_rng_state = _no_cuda_rng_state
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                from megatron.core.tensor_parallel import random as mrandom

                (
                    torch.cuda.current_device,
                    torch.cuda.synchronize,
                    torch.Tensor.cuda,
                    mrandom._get_cuda_rng_state,
                    mrandom._set_cuda_rng_state,
                ) = _SAVED


def _stay_on_cpu(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def _cpu_device() -> str:
    return "cpu"


def _cpu_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _no_cuda_rng_state(*args: Any, **kwargs: Any) -> None:
    return None


class _CudaArgsToCpu(TorchFunctionMode):
    """Explicit ``device="cuda"`` -> cpu; ``Tensor.type()`` answers ``torch.cuda.*Tensor`` (megatron's asserts)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs = {**kwargs, "device": "cpu"}
        out = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs and isinstance(out, str):
            out = out.replace("torch.", "torch.cuda.", 1)
        return out


@contextlib.contextmanager
def cuda_tensors_on_cpu(active: bool = True) -> Iterator[None]:
    """While open (and ``active``): explicit CUDA devices become the CPU and ``current_device()`` is ``"cpu"``.

    Used around Megatron's optimizer construction, step and gradient-norm code only: a torch-function mode
    sees every torch call, which costs time in the forward.
    """
    if not active:
        yield
        return
    with current_device_is_cpu(), _CudaArgsToCpu():
        yield


def init_rng_tracker(seed: int, *, on_cpu: bool) -> None:
    """Seed Megatron's tensor-parallel RNG tracker: CUDA generators on accelerators, the inference tracker on cpu.

    The inference tracker's ``fork()`` does not switch generators: dropout in tensor-parallel regions then draws
    from torch's default generator (seeded by the worker). The engines here train with dropout 0 as verl does.
    """
    from megatron.core import tensor_parallel

    if on_cpu:
        from megatron.core.tensor_parallel.random import initialize_rng_tracker

        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
