"""verl's ``PlatformTests`` conformance kit on the ``npu`` platform. Here (no Ascend) the device tests skip with
the probe's reason; the probe checks (never raises, a reasoned "no", no device initialised and torch_npu not
imported in a fresh process) run. On an Ascend host every test runs: that is the bring-up check."""

from __future__ import annotations

import importlib.metadata as metadata

import pytest

from verl.testing.conformance import PlatformTests

INSTALLED = any(ep.name == "npu" for ep in metadata.entry_points(group="verl.plugins"))


@pytest.mark.skipif(
    not INSTALLED,
    reason="verl-npu is not installed (pip install -e plugins/verl-npu): the kit takes the plugin manager's spec",
)
class TestNpuPlatform(PlatformTests):
    platform_name = "npu"
    forbidden_imports = ("torch_npu",)  # the probe leaves the one import to its child process
