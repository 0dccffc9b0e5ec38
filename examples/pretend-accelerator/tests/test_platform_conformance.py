"""verl's platform kit on the ``pretend`` platform: what a vendor runs on its own plugin.

Run with the plugin installed and the pretend devices switched on (``tests/vendor`` at the repository root does
this in a subprocess)::

    VERL_PRETEND_DEVICES=2 python -m pytest examples/pretend-accelerator/tests -q

Without ``VERL_PRETEND_DEVICES`` the probe tests run and the others skip with the probe's reason, as they do
for a real accelerator on a machine without it.
"""

from __future__ import annotations

from verl.testing.conformance import PlatformTests


class TestPretendPlatformConformance(PlatformTests):
    platform_name = "pretend"
    # A real vendor lists its torch extension here (``("torch_npu",)``); the pretend platform must not pull in
    # a backend either.
    forbidden_imports = ("torch_npu", "vllm")
