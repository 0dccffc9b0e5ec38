"""verl's plugin system: pluggy hooks returning typed spec records, found through entry points.

    from verl.plugins import hookimpl, get_plugin_manager

    pm = get_plugin_manager()                  # process-wide; plugins load on the first query
    spec = pm.get("rollout_engine", "vllm")    # UnknownPluginError / PluginConflictError otherwise
    pm.available("advantage_estimator")        # {name: spec}
    pm.failures                                # plugins that failed to load, with their errors

The hook API for plugin authors is documented in :mod:`verl.plugins.hookspecs`, the records in
:mod:`verl.plugins.specs`. Importing this package imports no plugin and no torch.
"""

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
from verl.plugins.specs import (
    KINDS,
    AdvantageEstimatorSpec,
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
    "RolloutEngineSpec",
    "TrainingEngineSpec",
    "UnknownPluginError",
    "get_plugin_manager",
    "hookimpl",
    "reset_plugin_manager",
]
