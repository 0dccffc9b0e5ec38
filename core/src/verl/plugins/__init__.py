"""verl's plugin system: pluggy hooks returning typed spec records, found through entry points.

    from verl.plugins import hookimpl, get_plugin_manager

    pm = get_plugin_manager()                  # process-wide; plugins load on the first query
    spec = pm.get("rollout_engine", "vllm")    # UnknownPluginError / PluginConflictError otherwise
    pm.available("advantage_estimator")        # {name: spec}
    pm.failures                                # plugins that failed to load, with their errors
    choose_platform(cfg.trainer.device)        # the platform of this process, and why (PlatformChoice)

The hook API for plugin authors is documented in :mod:`verl.plugins.hookspecs`, the records in
:mod:`verl.plugins.specs`. Importing this package imports no plugin and no torch.
"""

from verl.plugins.algorithm_lookup import get_adv_estimator_fn, get_policy_loss_fn
from verl.plugins.discovery import (
    ENTRY_POINT_GROUP,
    ENV_ALLOW_LIST,
    PLUGIN_API_VERSION,
    PluginInfo,
    PluginLoadFailure,
)
from verl.plugins.errors import (
    IncompatiblePluginError,
    PlatformResolutionError,
    PlatformUnavailableError,
    PluginConflictError,
    PluginError,
    PluginValidationError,
    UnknownPluginError,
)
from verl.plugins.hookspecs import hookimpl
from verl.plugins.manager import Claim, PluginManager, get_plugin_manager, reset_plugin_manager
from verl.plugins.platforms import (
    PlatformChoice,
    ProbeAnswer,
    choose_platform,
    current_platform,
    probe_platforms,
    resolve_platform,
)
from verl.plugins.specs import (
    KINDS,
    AdvantageEstimatorSpec,
    AgentLoopSpec,
    CheckpointEngineSpec,
    PlatformSpec,
    PolicyLossSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_ALLOW_LIST",
    "KINDS",
    "PLUGIN_API_VERSION",
    "AdvantageEstimatorSpec",
    "CheckpointEngineSpec",
    "Claim",
    "IncompatiblePluginError",
    "PlatformChoice",
    "PlatformResolutionError",
    "PlatformSpec",
    "PlatformUnavailableError",
    "PluginConflictError",
    "PluginError",
    "PluginInfo",
    "PluginLoadFailure",
    "PluginManager",
    "PluginValidationError",
    "PolicyLossSpec",
    "AgentLoopSpec",
    "ProbeAnswer",
    "RolloutEngineSpec",
    "TrainingEngineSpec",
    "UnknownPluginError",
    "choose_platform",
    "current_platform",
    "get_adv_estimator_fn",
    "get_plugin_manager",
    "get_policy_loss_fn",
    "hookimpl",
    "probe_platforms",
    "reset_plugin_manager",
    "resolve_platform",
]
