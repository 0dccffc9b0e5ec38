"""The platform kit run on core's ``cpu`` platform (every test runs) and ``cuda`` (skips here with the reason).

``cuda`` lists ``torch_npu`` and ``vllm`` as forbidden imports: its probe must not pull in a backend.
"""

from __future__ import annotations

from verl.testing.conformance import PlatformTests


class TestCpuPlatformConformance(PlatformTests):
    platform_name = "cpu"


class TestCudaPlatformConformance(PlatformTests):
    platform_name = "cuda"
    forbidden_imports = ("torch_npu", "vllm")
