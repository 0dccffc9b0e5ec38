"""The training-engine conformance kit on ``megatron`` in one process (world size 1, gloo), against the reference
engine; the multi-rank layouts (TP=2, PP=2, DP=2) are in ``test_megatron_equivalence.py``."""

from __future__ import annotations

import pytest

from verl.testing.conformance import TrainingEngineTests

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")


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


class TestMegatronTrainingConformancePadToMiniBatchMax(TrainingEngineTests):
    """verl's ``pad_bshd_to_minibatch_max``: micro-batches padded to the mini-batch's longest row; same numbers."""

    strategy = "megatron"

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"pad_bshd_to_minibatch_max": True}
