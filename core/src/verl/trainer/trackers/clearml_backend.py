"""``trainer.logger=[..., clearml]``: ClearML, as verl's ``ClearMLLogger`` (verl/utils/tracking.py).

``Task.init(project_name=trainer.project_name, task_name=trainer.experiment_name, continue_last_task=True,
output_uri=False)`` and the resolved config connected as the configuration ``Hyperparameters``. Server and
credentials come from ClearML's own settings (``clearml.conf``, ``CLEARML_API_HOST``, ...);
``CLEARML_OFFLINE_MODE=1`` (or ``Task.set_offline(True)`` beforehand) keeps everything in a local session
folder to import later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl.trainer.trackers.values import scalars, to_json_safe

Sample = tuple[str, str, float]


def split_key(key: str) -> tuple[str, str]:
    """ClearML's ``(title, series)`` of a metric name: ``"critic/score/mean"`` -> ``("critic", "score/mean")``.

    As verl (``k.split("/", 1)``); a name without ``/`` (verl fails on it) is its own title and series.
    """
    title, sep, series = key.partition("/")
    return (title, series) if sep else (key, key)


class ClearmlBackend:
    """Scalars via ``Logger.report_scalar(title, series, value, iteration=step)``; validation samples via
    ``report_table`` (title ``Validation``, series ``Validation generations``, verl's names)."""

    def __init__(
        self, project_name: str, experiment_name: str, run_dir: Path, config_dict: Mapping[str, Any] | None
    ) -> None:
        import clearml

        self.task = clearml.Task.init(
            task_name=experiment_name, project_name=project_name, continue_last_task=True, output_uri=False
        )
        if config_dict is not None:
            self.task.connect_configuration(to_json_safe(dict(config_dict)), name="Hyperparameters")
        self._logger = self.task.get_logger()

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in scalars(data).items():
            title, series = split_key(key)
            self._logger.report_scalar(title=title, series=series, value=value, iteration=step)

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        # A list of rows with a header row: ClearML's table input without needing pandas.
        table = [["step", "input", "output", "score"]]
        table += [[step, str(inp), str(out), float(score)] for inp, out, score in samples]
        self._logger.report_table(title="Validation", series="Validation generations", iteration=step, table_plot=table)

    def close(self, exit_code: int = 0) -> None:
        if self.task is not None:
            task, self.task = self.task, None
            if exit_code != 0:
                task.mark_failed(status_reason=f"exit code {exit_code}")
            task.close()
