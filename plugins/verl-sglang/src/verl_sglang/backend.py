"""Finding and importing SGLang, with errors that say what to install.

SGLang comes from PyPI as ``sglang`` (the ``[cuda]`` extra of this plugin). Its engine needs a compiled kernel
package for the device: ``sgl_kernel`` (imported under that name by ``sglang/srt``; PyPI ``sgl-kernel`` up to
0.3.x, renamed ``sglang-kernel`` from sglang 0.5.12, which verl's ``sglang_rollout.py`` checks as
``sglang_kernel``) on CUDA, ``sgl_kernel_npu`` beside ``torch_npu`` on Ascend
(``sglang/srt/hardware_backend/npu/allocator_npu.py``). None of them has a CPU wheel, so on a machine without
a GPU the plugin is listed as not usable with that reason. Everything here finds packages with
``importlib.util.find_spec`` and never imports SGLang (``verl plugins`` stays cheap).
"""

from __future__ import annotations

import importlib.util
from typing import Any

#: Devices the ``sglang`` spec declares: CUDA (NVIDIA; ROCm builds report ``cuda`` too) and Ascend NPU, the two
#: SGLang runs on from released wheels (``sglang/srt/platforms/``). SGLang's Xeon CPU backend needs a source
#: build of its kernels, so ``cpu`` is not declared.
SUPPORTED_DEVICES = ("cuda", "npu")
CUDA_KERNELS = ("sgl_kernel", "sglang_kernel")
NPU_KERNELS = ("torch_npu", "sgl_kernel_npu")
INSTALL_HINT = "pip install './plugins/verl-sglang[cuda]' from the verl checkout, on a machine with an NVIDIA GPU"


class SGLangNotInstalledError(ImportError):
    """SGLang (or the kernel package its engine needs) cannot be imported; the message says what to install."""


class UnsupportedDeviceError(ValueError):
    """The ``sglang`` rollout engine was asked to run on a device type SGLang does not run on here."""


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken half-installed package
        return False


def sglang_available() -> bool | str:
    """The spec's ``available``: True, or why the ``sglang`` engine cannot run on this machine.

    * ``sglang`` missing: the install command;
    * ``sglang`` present, no kernel package: ``"sgl_kernel missing: needs a CUDA GPU (...)"`` (the state of a CPU
      machine where sglang was installed ``--no-deps`` for the tests);
    * a CUDA kernel package (``sgl_kernel`` / ``sglang_kernel``) or the Ascend pair (``torch_npu`` +
      ``sgl_kernel_npu``) present: True.
    """
    if not _found("sglang"):
        return f"SGLang is not installed: {INSTALL_HINT}"
    if any(_found(name) for name in CUDA_KERNELS):
        return True
    if all(_found(name) for name in NPU_KERNELS):
        return True
    return f"sgl_kernel missing: needs a CUDA GPU ({INSTALL_HINT})"


def device_type(device: Any) -> str:
    """``"cuda"``, ``"npu"`` or ``"cpu"`` for a torch device / device string (``"cuda:1"`` -> ``"cuda"``).

    ``cpu`` is accepted by the engine class (SGLang's source-built Xeon backend, and the stand-in tests); the
    spec does not declare it, so config load refuses ``sglang`` on a cpu trainer.

    Raises:
        UnsupportedDeviceError: any other device type (e.g. ``mps``), naming the supported ones.
    """
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind not in (*SUPPORTED_DEVICES, "cpu"):
        raise UnsupportedDeviceError(
            f"rollout engine 'sglang' does not support device {str(device)!r} (supports: "
            f"{', '.join(SUPPORTED_DEVICES)}); set actor_rollout_ref.rollout.name=hf, or trainer.device to one of those"
        )
    return kind


def device_index(device: Any) -> int | None:
    """The device's ordinal (``cuda:1`` -> 1), or None for a bare ``cuda`` (the current device)."""
    if isinstance(device, str):
        return int(device.split(":", 1)[1]) if ":" in device else None
    index = getattr(device, "index", None)
    return None if index is None else int(index)


def import_sglang() -> Any:
    """Import and return the ``sglang`` module (its ``Engine`` is a lazy attribute).

    Raises:
        SGLangNotInstalledError: sglang is missing or fails to import (original error chained).
    """
    try:
        import sglang
    except ImportError as exc:
        raise SGLangNotInstalledError(
            f"rollout engine 'sglang' needs the sglang package, which cannot be imported ({exc}); {INSTALL_HINT}, "
            "or use actor_rollout_ref.rollout.name=hf"
        ) from exc
    return sglang


def sglang_version() -> str | None:
    """The installed sglang distribution's version (package metadata, no import), or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
