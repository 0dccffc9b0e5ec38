"""Entry module of the verl-trtllm plugin (entry point ``trtllm`` in the group ``verl.plugins``).

Imports only verl, attrs and the standard library at module level; TensorRT-LLM is imported when the
factory is called, so ``verl plugins`` lists this plugin where TensorRT-LLM is not installed (everywhere but
an NVIDIA GPU machine with NVIDIA's wheels).
"""

from __future__ import annotations

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import RolloutEngineSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION

#: The one command that installs the backend (NVIDIA publishes TensorRT-LLM wheels on its own index only).
INSTALL_COMMAND = "pip install --extra-index-url https://pypi.nvidia.com './plugins/verl-trtllm[cuda]'"


@hookimpl
def verl_rollout_engines() -> list[RolloutEngineSpec]:
    """``trtllm``: a ``tensorrt_llm.LLM(backend="pytorch")`` beside the trainer (hybrid mode), cuda only.

    No ``share_module`` capability (TensorRT-LLM loads its own copy of the weights; the worker syncs them
    through ``update_weights``) and no ``tensor_parallel`` (one TensorRT-LLM worker per engine: core refuses
    ``rollout.tensor_model_parallel_size > 1`` for this engine at config load).
    """
    from verl_trtllm.builder import build_trtllm_rollout_engine
    from verl_trtllm.options import TRTLLMRolloutOptions
    from verl_trtllm.rollout_keys import check_trtllm_rollout_config

    return [
        RolloutEngineSpec(
            name="trtllm",
            factory=build_trtllm_rollout_engine,
            options_cls=TRTLLMRolloutOptions,
            devices=("cuda",),
            capabilities=frozenset(),
            available=trtllm_available,
            check_config=check_trtllm_rollout_config,
        )
    ]


def trtllm_available() -> bool | str:
    """True when ``tensorrt_llm`` is installed (found with ``importlib.util.find_spec``, never imported:
    importing it initialises CUDA and loads its kernels); else the reason with the install command."""
    import importlib.util

    if importlib.util.find_spec("tensorrt_llm") is not None:
        return True
    return (
        "TensorRT-LLM is not installed (it runs on NVIDIA GPUs only and is published on NVIDIA's index, not "
        f"PyPI): from the verl checkout, {INSTALL_COMMAND}"
    )
