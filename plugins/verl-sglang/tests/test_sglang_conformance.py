"""The core rollout conformance suite on the ``sglang`` engine, on a CUDA GPU (``scripts/check_cuda.sh``).

The engine is built from the ``sglang`` spec and a loaded config, as the worker builds it. The model is the suite's
tiny Llama with ``hidden_size=256`` (head_dim 64, which SGLang's flashinfer kernels take); bfloat16, the suite's
bf16 tolerance (5e-2). Skipped where there is no CUDA GPU or no SGLang kernel package.
"""

from __future__ import annotations

import pytest
import torch

from verl.testing.conformance import RolloutEngineTests, save_conformance_model


def _why_not() -> str | None:
    from verl_sglang.backend import sglang_available

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    usable = sglang_available()
    return None if usable is True else usable


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


class TestSGLangRolloutConformance(RolloutEngineTests):
    rollout_name = "sglang"

    @pytest.fixture(scope="module")
    @classmethod
    def model_path(cls, tmp_path_factory):
        return save_conformance_model(tmp_path_factory.mktemp("sglang_conformance") / "model", hidden_size=256)

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls):
        return torch.device("cuda", torch.cuda.current_device())

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"log_level": "warning"}

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return [
            "trainer.device=cuda",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
            "actor_rollout_ref.rollout.enforce_eager=true",
        ]

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls):
        return 5e-2


class TestSGLangRolloutConformanceCudaGraphs(TestSGLangRolloutConformance):
    """The same with SGLang's CUDA graphs (its default) and deterministic inference (per-row sampling seeds)."""

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls):
        return {"log_level": "warning", "enable_deterministic_inference": True}

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return [
            "trainer.device=cuda",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        ]
