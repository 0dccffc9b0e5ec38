"""The training-engine conformance kit run on ``fsdp`` in one process (world size 1, gloo), against the
reference engine; the two-rank equivalence tests (``test_fsdp_equivalence.py``) cover sharding itself."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from verl.testing.conformance import TrainingEngineTests


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    """A 1-rank gloo default process group for FSDP2, torn down after the module (other tests start clean)."""
    from verl.engines.weight_sync import free_port

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


class TestFSDPTrainingConformance(TrainingEngineTests):
    strategy = "fsdp"


class TestFSDPTrainingConformanceZeRO2(TrainingEngineTests):
    """Options through engine_kwargs: keep gathered parameters for backward, prefetch the next layer."""

    strategy = "fsdp"

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"reshard_after_forward": False, "forward_prefetch": True}
