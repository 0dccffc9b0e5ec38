"""The weight-sync kit run on core's ``colocated`` and ``broadcast`` checkpoint engines.

``colocated`` runs in-process only (it has no sync group); ``broadcast`` runs both in-process (its direct
hand-over when trainer and rollout share a process) and over a 2-rank gloo group in two threads, where the
bucket counts are checked against the planner.
"""

from __future__ import annotations

import pytest

from verl.testing.conformance import CheckpointEngineTests


class TestColocatedConformance(CheckpointEngineTests):
    backend = "colocated"


class TestBroadcastConformance(CheckpointEngineTests):
    """``broadcast`` is for a rollout outside the trainer's processes: placement ``colocated`` (its group
    runs on gloo; config load refuses it under ``hybrid``)."""

    backend = "broadcast"

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls):
        return ["actor_rollout_ref.rollout.placement=colocated"]
