"""The training-engine conformance kit on ``megatron`` in one process (world size 1, gloo), against the reference
engine; the multi-rank layouts (TP=2, PP=2, DP=2) are in ``test_megatron_equivalence.py``."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from verl.testing.conformance import TrainingEngineTests


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    """A 1-rank gloo group and Megatron's parallel state, torn down after the module (other tests start clean)."""
    from verl.engines.weight_sync import free_port

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


class TestMegatronTrainingConformance(TrainingEngineTests):
    """Default options (TP=PP=1, distributed optimizer, local layer spec on cpu, float32)."""

    strategy = "megatron"


class TestMegatronTrainingConformanceNoDistOpt(TrainingEngineTests):
    """Megatron's plain (non-distributed) fp32 optimizer."""

    strategy = "megatron"

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"use_distributed_optimizer": False}
