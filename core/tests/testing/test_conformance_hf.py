"""The rollout conformance suite run on core's ``hf`` engine (the reference every plugin is held to)."""

from __future__ import annotations

import pytest

from verl.engines.reference.rollout import HFRolloutEngine
from verl.testing.conformance import RolloutEngineTests, make_rollout_config


class TestHFRolloutConformance(RolloutEngineTests):
    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine_factory(cls):
        return lambda model_path, tokenizer, config: HFRolloutEngine(model_path, tokenizer, config, device="cpu")


class TestHFRolloutConformanceBF16(RolloutEngineTests):
    """The same engine in bfloat16: the suite passes at the documented bf16 tolerance."""

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine_factory(cls):
        return lambda model_path, tokenizer, config: HFRolloutEngine(model_path, tokenizer, config, device="cpu")

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_config(cls):
        return make_rollout_config(dtype="bfloat16")

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 5e-2
