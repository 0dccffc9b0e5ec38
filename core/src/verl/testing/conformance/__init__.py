"""Conformance kits that engine and platform plugins subclass to prove they meet verl's protocols.

* :class:`RolloutEngineTests` (:mod:`~verl.testing.conformance.rollout`): a rollout engine against the tensor
  layout contract of :mod:`verl.engines.base` and the reference training engine;
* :class:`TrainingEngineTests` (:mod:`~verl.testing.conformance.training`): a training engine against core's
  ``reference`` engine (log-probs, two updates, gradient accumulation, token-mean, state dict, weights, offload);
* :class:`CheckpointEngineTests` (:mod:`~verl.testing.conformance.checkpoint`): a weight-sync engine moving a
  reference trainer's weights into an ``hf`` rollout (sync, bucket boundaries, refused mismatches);
* :class:`PlatformTests` (:mod:`~verl.testing.conformance.platform`): a device platform (probe, device facts,
  seeding, memory stats, a collective, reference log-probs on the device).

Each kit builds what it tests from the plugin's real spec and a config loaded with
:func:`verl.config.load_config` (:mod:`~verl.testing.conformance.build`). Importing this package imports
pytest and torch; it is meant for test code: the ``testing`` extra of verl-core (from the verl checkout:
``pip install './core[testing]'``), or just pytest.
"""

try:
    import pytest  # noqa: F401  (the kits are pytest classes)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "verl.testing.conformance needs pytest, which verl-core does not install by default: "
        "install its testing extra (from the verl checkout: pip install './core[testing]') or pytest itself "
        "(pip install pytest)"
    ) from exc

from verl.testing.conformance.build import (
    build_checkpoint_engine,
    build_rollout_engine,
    build_training_engine,
    engine_overrides,
    kwargs_overrides,
    load_kit_config,
    plugin_spec,
)
from verl.testing.conformance.checkpoint import CheckpointEngineTests
from verl.testing.conformance.checks import (
    check_eos_stops,
    check_log_probs_close,
    check_output_layout,
    eos_token_ids,
    expected_position_ids,
)
from verl.testing.conformance.fixtures import KitFixtures
from verl.testing.conformance.inputs import (
    CONFORMANCE_PROMPTS,
    SECONDARY_EOS_CHARS,
    make_prompt_batch,
    make_rollout_config,
    make_training_batch,
    perturb_weights,
    save_conformance_model,
)
from verl.testing.conformance.platform import PlatformTests
from verl.testing.conformance.rollout import RolloutEngineTests, rollout_overrides
from verl.testing.conformance.training import TrainingEngineTests, reference_config, training_overrides

__all__ = [
    "KitFixtures",
    "CONFORMANCE_PROMPTS",
    "SECONDARY_EOS_CHARS",
    "CheckpointEngineTests",
    "PlatformTests",
    "RolloutEngineTests",
    "TrainingEngineTests",
    "build_checkpoint_engine",
    "build_rollout_engine",
    "build_training_engine",
    "check_eos_stops",
    "check_log_probs_close",
    "check_output_layout",
    "engine_overrides",
    "eos_token_ids",
    "expected_position_ids",
    "kwargs_overrides",
    "load_kit_config",
    "make_prompt_batch",
    "make_rollout_config",
    "make_training_batch",
    "perturb_weights",
    "plugin_spec",
    "reference_config",
    "rollout_overrides",
    "save_conformance_model",
    "training_overrides",
]
