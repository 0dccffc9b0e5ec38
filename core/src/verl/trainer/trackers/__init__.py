"""Tracking backends that need a library of their own: ``wandb``, ``mlflow``, ``swanlab``, ``clearml``.

One module per backend, each following the matching adapter in verl's ``verl/utils/tracking.py`` (same
``trainer.logger`` name, same environment variables, same init arguments). A backend's library is imported
only when that backend is asked for; each is an optional extra of verl-core
(``pip install './core[wandb]'`` from the verl checkout; verl-core is on no package index).

Every backend has the interface :class:`verl.trainer.tracking.Tracking` drives: ``log(data, step)``,
``log_generations(samples, step)`` and ``close(exit_code=0)``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple


class TrackingBackendError(ValueError):
    """Unknown backend name, or a backend whose package is not installed."""


class OptionalBackend(NamedTuple):
    """Where a backend lives and what it needs: ``module`` is the library imported, ``extra`` the
    verl-core extra that installs it, ``factory`` the ``"module:Class"`` of the backend."""

    module: str
    extra: str
    factory: str


OPTIONAL_BACKENDS: dict[str, OptionalBackend] = {
    "wandb": OptionalBackend("wandb", "wandb", "verl.trainer.trackers.wandb_backend:WandbBackend"),
    "mlflow": OptionalBackend("mlflow", "mlflow", "verl.trainer.trackers.mlflow_backend:MlflowBackend"),
    "swanlab": OptionalBackend("swanlab", "swanlab", "verl.trainer.trackers.swanlab_backend:SwanlabBackend"),
    "clearml": OptionalBackend("clearml", "clearml", "verl.trainer.trackers.clearml_backend:ClearmlBackend"),
}


def install_hint(extra: str) -> str:
    """The pip command that installs a verl-core extra, for error messages."""
    return f"pip install './core[{extra}]' (from the verl checkout; verl-core is on no package index)"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec
        return False


def check_installed(names: Iterable[str]) -> None:
    """Fail before anything starts if a requested optional backend's library is missing.

    Raises:
        TrackingBackendError: naming every missing backend and the pip command of its extra.
    """
    missing = [name for name in names if name in OPTIONAL_BACKENDS and not _installed(OPTIONAL_BACKENDS[name].module)]
    if missing:
        lines = [
            f"trainer.logger includes {name!r} but the {OPTIONAL_BACKENDS[name].module} package is not installed: "
            f"{install_hint(OPTIONAL_BACKENDS[name].extra)}, or drop {name!r} from trainer.logger"
            for name in missing
        ]
        raise TrackingBackendError("; ".join(lines))


def open_backend(
    name: str, project_name: str, experiment_name: str, run_dir: Path, config_dict: Mapping[str, Any] | None
) -> Any:
    """Start the optional backend ``name`` (a key of :data:`OPTIONAL_BACKENDS`) and return it.

    Raises:
        TrackingBackendError: ``name`` is not an optional backend, or its library is missing.
    """
    spec = OPTIONAL_BACKENDS.get(name)
    if spec is None:
        raise TrackingBackendError(f"{name!r} is not an optional tracking backend; known: {sorted(OPTIONAL_BACKENDS)}")
    check_installed([name])
    module_name, class_name = spec.factory.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(project_name, experiment_name, run_dir, config_dict)
