"""``trainer.logger=[..., mlflow]``: MLflow, as verl's ``mlflow`` backend (verl/utils/tracking.py).

Environment, as verl: ``MLFLOW_TRACKING_URI`` (default ``sqlite:////tmp/mlruns.db``; a server
``http://host:5000`` works too), ``MLFLOW_RUN_ID`` (attach to an existing run, as Azure ML and Databricks
set it; otherwise a run named ``trainer.experiment_name`` starts in the MLflow experiment
``trainer.project_name``, created when missing). The resolved config is logged once as params, flattened
with ``/`` (:func:`verl.trainer.trackers.values.flatten_params`).

Deviation from verl: when the tracking store cannot be reached after 3 attempts, verl warns and trains on
without MLflow; here the run stops with the error, so metrics are never silently lost.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl.trainer.trackers import TrackingBackendError
from verl.trainer.trackers.values import flatten_params, scalars, to_json_safe

logger = logging.getLogger(__name__)

Sample = tuple[str, str, float]
DEFAULT_TRACKING_URI = "sqlite:////tmp/mlruns.db"  # verl's default
MAX_ATTEMPTS = 3
RETRY_SLEEP_S = 5.0
# MLflow metric names allow alphanumerics, _ - . / : and spaces (mlflow/utils/validation.py).
_INVALID_CHARS = re.compile(r"[^/\w.\- :]")
_REPEATED_SLASHES = re.compile(r"/+")
MAX_PARAM_CHARS = 6000  # MLflow refuses longer param values (mlflow/utils/validation.py)


def sanitize_metric_key(key: str) -> str:
    """An MLflow-valid metric name, as verl's ``_MlflowLoggingAdapter._sanitize_key``.

    ``@`` -> ``_at_`` (``val-core/.../acc/best@4/mean`` stays readable), runs of ``/`` -> one ``/``,
    any other character MLflow refuses -> ``_``.
    """
    text = _REPEATED_SLASHES.sub("/", key.replace("@", "_at_"))
    return _INVALID_CHARS.sub("_", text)


def _param_value(value: Any) -> Any:
    text = str(value)  # what MLflow stores
    return value if len(text) <= MAX_PARAM_CHARS else text[: MAX_PARAM_CHARS - 3] + "..."


class MlflowBackend:
    """Scalars via ``mlflow.log_metrics(metrics, step=step)`` (keys sanitized, a warning once per renamed key);
    validation samples as the JSON artifact ``val_step{step}.json`` (``[{input, output, score}, ...]``).

    Raises:
        TrackingBackendError: the tracking store failed :data:`MAX_ATTEMPTS` times (message names the URI).
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        run_dir: Path,
        config_dict: Mapping[str, Any] | None,
        retry_sleep_s: float = RETRY_SLEEP_S,
    ) -> None:
        import mlflow

        self._mlflow = mlflow
        self.tracking_uri = os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)
        self._renamed: dict[str, str] = {}
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                self.run = self._start(project_name, experiment_name, config_dict)
                break
            except Exception as exc:  # store unreachable, locked sqlite file, server error, ...
                if attempt == MAX_ATTEMPTS:
                    raise TrackingBackendError(
                        f"mlflow: could not start a run at MLFLOW_TRACKING_URI={self.tracking_uri} after "
                        f"{MAX_ATTEMPTS} attempts: {exc}; check the URI (or unset it for {DEFAULT_TRACKING_URI}) "
                        "or drop 'mlflow' from trainer.logger"
                    ) from exc
                logger.warning("mlflow start attempt %d/%d failed: %s", attempt, MAX_ATTEMPTS, exc)
                time.sleep(retry_sleep_s)
        self.run_id: str = self.run.info.run_id
        logger.info("mlflow: run %s at %s", self.run_id, self.tracking_uri)

    def _start(self, project_name: str, experiment_name: str, config_dict: Mapping[str, Any] | None) -> Any:
        mlflow = self._mlflow
        mlflow.set_tracking_uri(self.tracking_uri)
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if run_id:
            # Its experiment becomes the active one: MLflow refuses the run while another experiment is
            # active in this process (an earlier set_experiment, e.g. a previous run of a sweep).
            existing = mlflow.MlflowClient().get_run(run_id)
            mlflow.set_experiment(experiment_id=existing.info.experiment_id)
            run = mlflow.start_run(run_id=run_id)
        else:
            # MLflow's "experiment" is verl's project: runs of one project are compared side by side.
            experiment = mlflow.set_experiment(project_name)
            run = mlflow.start_run(experiment_id=experiment.experiment_id, run_name=experiment_name)
        try:
            params = flatten_params(to_json_safe(dict(config_dict)) if config_dict is not None else None)
            if params:
                mlflow.log_params({k: _param_value(v) for k, v in params.items()})
        except BaseException:
            mlflow.end_run(status="FAILED")
            raise
        return run

    def _key(self, key: str) -> str:
        if key not in self._renamed:
            clean = sanitize_metric_key(key)
            if clean != key:
                logger.warning("mlflow: metric %r logged as %r (characters MLflow does not allow)", key, clean)
            self._renamed[key] = clean
        return self._renamed[key]

    def log(self, data: Mapping[str, Any], step: int) -> None:
        metrics = {self._key(k): v for k, v in scalars(data).items()}
        if metrics:
            self._mlflow.log_metrics(metrics, step=step, run_id=self.run_id)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        rows = [
            {"input": str(inp), "output": str(out), "score": to_json_safe(float(score))} for inp, out, score in samples
        ]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, f"val_step{step}.json")
            path.write_text(json.dumps(rows), encoding="utf-8")
            self._mlflow.log_artifact(str(path), run_id=self.run_id)

    def close(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run = None
            self._mlflow.end_run(status="FINISHED" if exit_code == 0 else "FAILED")
