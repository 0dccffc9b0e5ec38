"""Experiment tracking: ``Tracking`` fans each step's metrics out to the backends named in ``trainer.logger``.

Follows ``verl/utils/tracking.py`` (``Tracking(project_name, experiment_name, default_backend, config)``,
``log(data, step)``, ``finish(exit_code)``). Built in, needing no account or network:

* ``console`` — one concise line per step (step, score, pg_loss, response length, SFT loss / val loss, step time,
  val-core/*), under a tqdm progress bar of the total steps when stdout is a terminal;
* ``file`` — ``{run_dir}/metrics.jsonl``: one JSON object per step, ``{"step": N, <metric>: value, ...}``,
  fsynced when logged; NaN/inf become ``null`` so every line is strict JSON. :meth:`Tracking.update` merges later
  metrics of the same step (validation) into that row, crash-safely
  (:class:`~verl.trainer.trackers.file_backend.FileBackend`). A run that starts at step ``S`` (resumed from
  ``global_step_S``, or ``S = 0`` from scratch) first rewinds the file to ``S`` (:meth:`Tracking.rewind`), so
  after a crash and a resume it holds one row per step, as an uninterrupted run's;
* ``tensorboard`` — scalars via ``torch.utils.tensorboard.SummaryWriter`` in ``$TENSORBOARD_DIR`` (as verl)
  or ``{run_dir}/tensorboard``; imported only when asked for.

Through their own libraries, each an optional extra of verl-core and imported only when asked for
(:mod:`verl.trainer.trackers`): ``wandb``, ``mlflow``, ``swanlab``, ``clearml``, with verl's environment
variables and init arguments. Their files default to the run directory where verl uses the working one.

With ``file``, ``{run_dir}/metrics.png`` shows the score, response-length and KL curves of ``metrics.jsonl``,
redrawn at most once a minute and at the end of the run (:class:`verl.trainer.trackers.curves.MetricsPlot`;
needs the ``plot`` extra, matplotlib — without it one info line says so and no PNG is drawn).

Validation samples (``trainer.log_val_generations``) go through :class:`ValidationGenerationsLogger`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from verl.config.schema.trainer import UNSHIPPED_LOGGERS, unshipped_logger_message
from verl.trainer.trackers import OPTIONAL_BACKENDS, TrackingBackendError, check_installed, open_backend
from verl.trainer.trackers.file_backend import (  # noqa: F401 - re-exported
    GENERATIONS_FILE,
    METRICS_FILE,
    FileBackend,
    Sample,
    step_ranges,
)
from verl.trainer.trackers.values import scalar as _scalar
from verl.trainer.trackers.values import to_json_safe

logger = logging.getLogger(__name__)

VALID_BACKENDS = ("console", "file", "tensorboard", *OPTIONAL_BACKENDS)
_CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("actor/pg_loss", "pg_loss"),
    ("response_length/mean", "resp_len"),
    ("train/loss", "loss"),  # verl sft
    ("val/loss", "val_loss"),
    ("timing_s/step", "step_s"),
)


def _format(value: float) -> str:
    return f"{value:.4g}"


class ConsoleBackend:
    """One line per step; a tqdm bar over ``total_steps`` when ``stream`` is a terminal."""

    def __init__(self, experiment_name: str, total_steps: int | None, stream: TextIO):
        self.experiment_name = experiment_name
        self.total_steps = total_steps
        self.stream = stream
        self._bar: Any = None
        self._use_bar = bool(getattr(stream, "isatty", lambda: False)())

    def _emit(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        if self._use_bar:
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(
                    total=self.total_steps, initial=max(step - 1, 0), desc=self.experiment_name, file=self.stream
                )
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
        of_total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"step {step}{of_total}"]
        for key, label in _CONSOLE_KEYS:
            value = _scalar(data.get(key))
            if value is not None:
                parts.append(f"{label} {_format(value)}")
        for key in sorted(k for k in data if k.startswith("val-core/")):
            value = _scalar(data[key])
            if value is not None:
                parts.append(f"{key} {_format(value)}")
        self._emit(" | ".join(parts))

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        for index, (inp, out, score) in enumerate(samples):
            self._emit(f"[val step {step} sample {index}] score {_format(float(score))}")
            self._emit(f"  input:  {_shorten(inp)}")
            self._emit(f"  output: {_shorten(out)}")

    def close(self, exit_code: int = 0) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TensorboardBackend:
    """Scalars (and the config / samples as text) through ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, run_dir: Path, config_dict: Mapping[str, Any] | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise TrackingBackendError(
                "trainer.logger includes 'tensorboard' but the tensorboard package is not installed: "
                "pip install tensorboard (or drop 'tensorboard' from trainer.logger)"
            ) from exc
        self.log_dir = Path(os.environ.get("TENSORBOARD_DIR") or run_dir / "tensorboard")
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        if config_dict is not None:
            text = json.dumps(to_json_safe(dict(config_dict)), indent=2)
            self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in data.items():
            number = _scalar(value)
            if number is not None:
                self.writer.add_scalar(key, number, global_step=step)
        self.writer.flush()

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        rows = ["| input | output | score |", "|---|---|---|"]
        for inp, out, score in samples:
            cells = [str(c).replace("|", "\\|").replace("\n", "<br>") for c in (inp, out)]
            rows.append(f"| {cells[0]} | {cells[1]} | {_format(float(score))} |")
        self.writer.add_text("val/generations", "\n".join(rows), global_step=step)
        self.writer.flush()

    def close(self, exit_code: int = 0) -> None:
        self.writer.close()


class Tracking:
    """Send each step's metrics to every backend in ``backends``.

    Args:
        project_name / experiment_name: verl ``trainer.project_name`` / ``trainer.experiment_name``.
        backends: verl ``trainer.logger``: names from :data:`VALID_BACKENDS` (``console``, ``file``,
            ``tensorboard``, ``wandb``, ``mlflow``, ``swanlab``, ``clearml``; a single string is accepted;
            duplicates are ignored).
        run_dir: folder of ``metrics.jsonl``, ``metrics.png`` and the default tensorboard / wandb / swanlab
            folders (created if missing).
        config_dict: the resolved config (plain dict): text in tensorboard, the run config in wandb and
            swanlab, params in mlflow, the ``Hyperparameters`` configuration in clearml.
        total_steps: length of the console progress bar (``None``: no total).
        stream: console output (default ``sys.stdout``).
        plot_interval_s: least seconds between two automatic redraws of ``metrics.png`` (with ``file``).

    Raises:
        TrackingBackendError (a ValueError): an unknown backend (the message lists the valid ones), a verl
            backend not shipped here (with the reason), or a backend whose library is missing (the message
            gives the pip command of its extra). Checked for all names before any backend opens a file or
            starts a run.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        backends: str | Iterable[str] = ("console",),
        run_dir: str | os.PathLike[str] = ".",
        config_dict: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        stream: TextIO | None = None,
        plot_interval_s: float = 60.0,
    ):
        from verl.trainer.trackers.curves import MetricsPlot

        names = [backends] if isinstance(backends, str) else list(backends)
        names = list(dict.fromkeys(names))
        for name in names:
            if name in UNSHIPPED_LOGGERS:
                raise TrackingBackendError(f"trainer.logger: {unshipped_logger_message(name)}")
            if name not in VALID_BACKENDS:
                raise TrackingBackendError(
                    f"unknown logger backend {name!r} in trainer.logger; valid: {list(VALID_BACKENDS)}"
                )
        check_installed(names)
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.run_dir = Path(run_dir)
        self.backends: dict[str, Any] = {}
        self.plot: MetricsPlot | None = None
        try:
            for name in names:
                if name == "console":
                    out = stream if stream is not None else sys.stdout
                    self.backends[name] = ConsoleBackend(experiment_name, total_steps, out)
                elif name == "file":
                    self.backends[name] = FileBackend(self.run_dir)
                elif name == "tensorboard":
                    self.backends[name] = TensorboardBackend(self.run_dir, config_dict)
                else:
                    self.run_dir.mkdir(parents=True, exist_ok=True)
                    self.backends[name] = open_backend(name, project_name, experiment_name, self.run_dir, config_dict)
        except BaseException:
            self.finish(exit_code=1)
            raise
        if "file" in self.backends:
            self.plot = MetricsPlot(
                self.backends["file"].path, f"{project_name}/{experiment_name}", interval_s=plot_interval_s
            )

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Log one step's ``{metric name: value}`` (numbers, numpy/torch scalars; text is kept by ``file``)."""
        for backend in self.backends.values():
            backend.log(data, step)
        if self.plot is not None:
            self.plot.maybe_refresh()

    def update(self, data: Mapping[str, Any], step: int) -> None:
        """Add metrics to the step logged last (validation after the step's training metrics).

        ``metrics.jsonl`` merges them into the row of ``step`` when that is its last row (else appends a row), so
        the file keeps one row per step (:meth:`FileBackend.update`); the other backends log them at ``step``
        as :meth:`log` does (console: a second line; tensorboard, wandb, ...: more values at the same step).
        """
        for name, backend in self.backends.items():
            if name == "file":
                backend.update(data, step)
            else:
                backend.log(data, step)
        if self.plot is not None:
            self.plot.maybe_refresh()

    def rows(self) -> list[dict[str, Any]] | None:
        """The rows of ``metrics.jsonl`` (dicts with an int ``"step"``), or ``None`` without a ``file`` backend."""
        backend = self.backends.get("file")
        return backend.rows() if backend is not None else None

    def rewind(self, step: int) -> int:
        """Prepare the logs for a run that starts at ``step`` (resumed from ``global_step_{step}``; 0: fresh).

        ``metrics.jsonl`` (the ``file`` backend) drops the rows of steps after ``step`` — they run again —
        so it reads as one uninterrupted run (see :meth:`FileBackend.rewind`). Console output is a stream and
        tensorboard event files are append-only: there the re-run steps simply appear again. Returns the
        number of rows dropped (0 without a ``file`` backend).
        """
        backend = self.backends.get("file")
        return backend.rewind(step) if backend is not None else 0

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        """Log ``(input, output, score)`` validation samples as text in every backend."""
        for backend in self.backends.values():
            backend.log_generations(samples, step)

    def finish(self, exit_code: int = 0) -> None:
        """Flush and close every backend, then draw ``metrics.png`` a last time (idempotent; verl's name).

        ``exit_code`` != 0 marks the run failed where the backend keeps a state (wandb, mlflow, swanlab,
        clearml). Every backend is closed even when one fails; the first failure is raised afterwards.
        """
        backends, self.backends = self.backends, {}
        error: BaseException | None = None
        for name, backend in backends.items():
            try:
                backend.close(exit_code)
            except Exception as exc:  # close the others first: an open wandb run would outlive the process
                logger.error("closing the %s logger failed: %s", name, exc)
                error = error or exc
        plot, self.plot = self.plot, None
        if plot is not None and (path := plot.refresh()) is not None:
            logger.info("curves of %s in %s", plot.metrics_path, path)
        if error is not None:
            raise error

    def close(self) -> None:
        """:meth:`finish` with exit code 0."""
        self.finish(0)

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.finish(0 if exc_type is None else 1)


class ValidationGenerationsLogger:
    """Log a fixed, seeded selection of validation generations each time validation runs.

    Selection as verl's ``RayPPOTrainer._maybe_log_val_generations``: ``(input, output, score)`` triples sorted
    by input, shuffled with ``numpy.random.RandomState(seed)`` (seed 42), first ``num_samples`` kept — so the
    same prompts are shown at every validation and their outputs can be compared across steps.

    Args:
        tracking: where to log (:meth:`Tracking.log_generations`).
        num_samples: verl ``trainer.log_val_generations``; 0 logs nothing.
    """

    def __init__(self, tracking: Tracking, num_samples: int, seed: int = 42):
        if num_samples < 0:
            raise ValueError(f"trainer.log_val_generations must be >= 0, got {num_samples}")
        self.tracking = tracking
        self.num_samples = num_samples
        self.seed = seed

    def select(self, inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float]) -> list[Sample]:
        """The samples :meth:`log` would write (a pure function of the arguments and the seed)."""
        if not len(inputs) == len(outputs) == len(scores):
            raise ValueError(f"inputs/outputs/scores lengths differ: {len(inputs)}, {len(outputs)}, {len(scores)}")
        samples = sorted(zip(inputs, outputs, (float(s) for s in scores), strict=True), key=lambda s: s[0])
        np.random.RandomState(self.seed).shuffle(samples)
        return samples[: self.num_samples]

    def log(self, inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float], step: int) -> list[Sample]:
        """Select and log; returns what was logged (empty when ``num_samples`` is 0)."""
        samples = self.select(inputs, outputs, scores)
        if samples:
            self.tracking.log_generations(samples, step)
        return samples
