"""The rollout conformance suite run on core's ``hf`` engine (the reference every plugin is held to).

Both classes build the engine from the ``hf`` spec and a loaded config, as the worker does.
"""

from __future__ import annotations

import pytest

from verl.testing.conformance import RolloutEngineTests


class TestHFRolloutConformance(RolloutEngineTests):
    rollout_name = "hf"


class TestHFRolloutConformanceBF16(RolloutEngineTests):
    """The same engine in bfloat16 (``rollout.dtype``): the suite passes at the documented bf16 tolerance."""

    rollout_name = "hf"

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return ["actor_rollout_ref.rollout.dtype=bfloat16"]

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 5e-2


class TestHFRolloutConformanceSleepLevel1(RolloutEngineTests):
    """An engine option through ``engine_kwargs``: ``engine_kwargs.hf.sleep_level=1`` (keep the weights in
    host memory while asleep) passes too."""

    rollout_name = "hf"

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"sleep_level": 1}
