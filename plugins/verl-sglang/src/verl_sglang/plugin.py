"""Entry module of the verl-sglang plugin (entry point ``sglang`` in the group ``verl.plugins``).

Imports only verl, attrs and the standard library at module level; SGLang is imported when the factory is
called, so ``verl plugins`` lists this plugin (and says why it cannot run) where SGLang is absent.
"""

from __future__ import annotations

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import RolloutEngineSpec

# verl.engines.weight_sync.names (the weight-update checks) arrived with plugin API 2.3.
VERL_PLUGIN_API = PLUGIN_API_VERSION


@hookimpl
def verl_rollout_engines() -> list[RolloutEngineSpec]:
    """``sglang``: an in-process ``sglang.Engine`` (hybrid mode) on cuda, or npu (SGLang's Ascend backend).

    No ``share_module`` capability: SGLang owns its own copy of the weights (fused, in its dtype), so the worker
    passes the model path and syncs weights through ``update_weights``.
    """
    from verl_sglang.backend import SUPPORTED_DEVICES, sglang_available
    from verl_sglang.builder import build_sglang_rollout_engine
    from verl_sglang.options import SGLangRolloutOptions
    from verl_sglang.rollout_keys import check_config

    return [
        RolloutEngineSpec(
            name="sglang",
            factory=build_sglang_rollout_engine,
            options_cls=SGLangRolloutOptions,
            devices=SUPPORTED_DEVICES,
            capabilities={"tensor_parallel"},
            available=sglang_available,
            check_config=check_config,
        )
    ]
