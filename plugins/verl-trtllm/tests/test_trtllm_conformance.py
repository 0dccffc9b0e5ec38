"""The core rollout conformance suite on the ``trtllm`` engine: NVIDIA GPU with TensorRT-LLM only.

Skipped here (no TensorRT-LLM, no GPU); ``scripts/check_cuda.sh`` runs it on a GPU machine. The engine is built
from the ``trtllm`` spec and a loaded config, as the worker builds it. The model is the suite's tiny Llama with
``hidden_size=128`` (head_dim 32: TensorRT-LLM's attention kernels, like vLLM's, do not take head_dim 8), in
bfloat16 (TensorRT-LLM's usual dtype) at the suite's documented bf16 tolerance, 5e-2.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verl.testing.conformance import RolloutEngineTests, save_conformance_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorrt_llm") is None,
        reason="TensorRT-LLM is not installed (NVIDIA GPU: pip install --extra-index-url https://pypi.nvidia.com "
        "'./plugins/verl-trtllm[cuda]')",
    ),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class TestTRTLLMRolloutConformanceBF16(RolloutEngineTests):
    rollout_name = "trtllm"

    @pytest.fixture(scope="module")
    @classmethod
    def model_path(cls, tmp_path_factory):
        return save_conformance_model(tmp_path_factory.mktemp("trtllm_conformance") / "model", hidden_size=128)

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls):
        return torch.device("cuda")

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {}

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return [
            "trainer.device=cuda",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            # A small KV cache: the rest of the GPU stays with the reference engine of the suite.
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
        ]

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 5e-2
