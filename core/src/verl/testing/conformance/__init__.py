"""Conformance suites that engine plugins subclass to prove they meet verl's engine protocols.

``RolloutEngineTests`` (:mod:`verl.testing.conformance.rollout`) checks a rollout engine against the
tensor layout contract of :mod:`verl.engines.base` and against the reference training engine.
Importing this package imports pytest and torch; it is meant for test code only.
"""

from verl.testing.conformance.checks import (
    check_eos_stops,
    check_log_probs_close,
    check_output_layout,
    eos_token_ids,
    expected_position_ids,
)
from verl.testing.conformance.inputs import (
    CONFORMANCE_PROMPTS,
    SECONDARY_EOS_CHARS,
    make_prompt_batch,
    make_rollout_config,
    perturb_weights,
    save_conformance_model,
)
from verl.testing.conformance.rollout import RolloutEngineTests

__all__ = [
    "CONFORMANCE_PROMPTS",
    "SECONDARY_EOS_CHARS",
    "RolloutEngineTests",
    "check_eos_stops",
    "check_log_probs_close",
    "check_output_layout",
    "eos_token_ids",
    "expected_position_ids",
    "make_prompt_batch",
    "make_rollout_config",
    "perturb_weights",
    "save_conformance_model",
]
