"""Entry module of the verl-npu plugin (entry point ``npu`` in the group ``verl.plugins``).

Imports only verl, the standard library and this package's light modules: the probe reads files and
metadata and leaves ``import torch_npu`` to a child process; the platform imports it in workers.
"""

from __future__ import annotations

from verl.platform import Platform, ProbeResult
from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import PlatformSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION


def probe() -> ProbeResult:
    """The ``npu`` probe (:func:`verl_npu.probe.probe_npu`)."""
    from verl_npu.probe import probe_npu

    return probe_npu()


def make_platform() -> Platform:
    """Factory of the ``npu`` spec: :class:`verl_npu.platform.NPUPlatform`."""
    from verl_npu.platform import NPUPlatform

    return NPUPlatform()


@hookimpl
def verl_platforms() -> list[PlatformSpec]:
    """``npu``: Huawei Ascend through torch-npu and CANN (``trainer.device=npu``)."""
    return [PlatformSpec(name="npu", probe=probe, factory=make_platform)]
