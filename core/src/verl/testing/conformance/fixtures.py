"""Fixtures every engine kit shares: what a plugin's subclass overrides to build its engine from its config.

:class:`KitFixtures` is the base of :class:`~verl.testing.conformance.TrainingEngineTests`,
:class:`~verl.testing.conformance.RolloutEngineTests` and :class:`~verl.testing.conformance.CheckpointEngineTests`.
Override a fixture under the same name, ``@pytest.fixture(scope="class")`` then ``@classmethod`` (the engine is
built once per class, so the fixtures it is built from must keep class scope or wider).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from verl.testing.conformance.inputs import save_conformance_model


class KitFixtures:
    """``engine_kwargs``, ``config_overrides``, ``device`` and ``model_path`` with the kits' defaults.

    ``engine_kwargs`` (default ``{}``)
        The backend's options, written to ``<section>.engine_kwargs.<name>`` and validated at config load.
    ``config_overrides`` (default ``[]``)
        More ``key=value`` overrides of the kit's config (verl keys).
    ``device`` (default ``torch.device("cpu")``)
        Where the engine runs.
    ``model_path`` (module scope)
        :func:`~verl.testing.conformance.save_conformance_model` in a tmp dir: the tiny Llama of
        :mod:`verl.testing.tiny` (2 layers, width 32, head_dim 8). Engines whose kernels need ``head_dim >= 32``
        override it with ``save_conformance_model(path, hidden_size=128)``.
    """

    @pytest.fixture(scope="class")
    @classmethod
    def engine_kwargs(cls) -> dict[str, Any]:
        return {}

    @pytest.fixture(scope="class")
    @classmethod
    def config_overrides(cls) -> list[str]:
        return []

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls) -> torch.device:
        return torch.device("cpu")

    @pytest.fixture(scope="module")
    @classmethod
    def model_path(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return save_conformance_model(tmp_path_factory.mktemp("conformance") / "model")
