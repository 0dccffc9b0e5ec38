"""What a device session of the nox matrix runs on: the platform and the backend combination, from the environment.

``nox -s "cuda(fsdp-hf)"`` sets ``VERL_TEST_DEVICE`` (a platform name: ``cuda``, ``rocm``, ``npu``),
``VERL_TEST_TRAINING`` / ``VERL_TEST_ROLLOUT`` (the combination's engines) and ``VERL_TEST_STEPS`` (main-job
steps, 3). Without ``VERL_TEST_DEVICE`` every test here is skipped (``nox -s core`` collects this folder).
Any platform name works, ``cpu`` or a plugin's included, which is how these tests are checked on a CPU machine:
``VERL_TEST_DEVICE=cpu VERL_TEST_TRAINING=reference VERL_TEST_ROLLOUT=hf pytest tests/device``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

SKIP_REASON = "VERL_TEST_DEVICE is not set: these tests run in the nox device sessions (nox -l: cuda(...), ...)"


@dataclass(frozen=True)
class Matrix:
    """One cell of the matrix: platform name, training engine, rollout engine, main-job steps."""

    device: str
    training: str
    rollout: str
    steps: int


def matrix_from_env() -> Matrix:
    """The cell the environment names (``VERL_TEST_DEVICE`` empty when no device session set it)."""
    return Matrix(
        device=os.environ.get("VERL_TEST_DEVICE", ""),
        training=os.environ.get("VERL_TEST_TRAINING", "reference"),
        rollout=os.environ.get("VERL_TEST_ROLLOUT", "hf"),
        steps=int(os.environ.get("VERL_TEST_STEPS", "3")),
    )


@pytest.fixture(scope="session", autouse=True)
def matrix() -> Matrix:
    """The session's cell; skips every test of this folder when ``VERL_TEST_DEVICE`` is not set.

    Session-scoped, so it runs (and skips) before the kits' class-scoped fixtures build anything.
    """
    cell = matrix_from_env()
    if not cell.device:
        pytest.skip(SKIP_REASON)
    return cell


@pytest.fixture(scope="session")
def device_platform(matrix: Matrix):
    """The platform of ``VERL_TEST_DEVICE``, resolved as a worker resolves ``trainer.device`` (probe included)."""
    from verl.plugins import resolve_platform

    return resolve_platform(matrix.device)
