"""``{run_dir}/metrics.png``: training curves (score, response length, KL) drawn from ``metrics.jsonl``.

Three panels over the step axis for an RL run:

* score — ``critic/score/mean`` per step, its trailing 3-step mean, and every ``val-core/*`` metric;
* response length — ``response_length/mean`` (tokens);
* KL — whichever of ``actor/kl_loss`` (KL loss, ``use_kl_loss``), ``actor/reward_kl_penalty`` (KL in reward)
  and ``actor/ppo_kl`` (old vs current policy) the run logged.

A ``verl sft`` run (rows with ``train/loss`` and no RL score) gets its own three: loss (``train/loss``,
``val/loss``), ``train/grad_norm`` and ``train/lr`` (:data:`SFT_PANELS`).

The data comes from :func:`read_metrics` + :func:`curve_series` (pure functions, tested against the file);
drawing needs matplotlib, the optional extra ``plot`` (``pip install './core[plot]'``). Figures are built
with ``matplotlib.figure.Figure`` and the Agg canvas, never through pyplot, so a run inside a notebook or a
GUI program leaves the host's matplotlib backend alone. ``scripts/results_page.py`` draws its score curve
with :func:`draw_score`, so a results page and a run's PNG show the same curves.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

PNG_FILE = "metrics.png"
SCORE_KEY = "critic/score/mean"
LENGTH_KEY = "response_length/mean"
KL_KEYS = ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")
VAL_PREFIX = "val-core/"
SMOOTH_WINDOW = 3
PANELS = ("score", "response length", "KL")
#: The panels of an SFT run (``verl sft``'s metric names, verl's): title -> keys.
SFT_PANELS = {"loss": ("train/loss", "val/loss"), "grad norm": ("train/grad_norm",), "learning rate": ("train/lr",)}


class Series(NamedTuple):
    """One metric over steps: ``steps[i]`` (int) has value ``values[i]`` (finite float); sorted by step."""

    key: str
    steps: list[int]
    values: list[float]


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``: JSON objects with an int ``"step"``, in file order.

    Lines that are not such an object (a line torn by a kill mid-write, blank lines) are skipped;
    a missing file gives ``[]``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
    return rows


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(rows: Sequence[Mapping[str, Any]], key: str) -> Series:
    """``key``'s finite values by step (``null``/NaN and non-numbers left out; a step logged twice keeps its
    last value, as a reader of the file would take the later row)."""
    by_step: dict[int, float] = {}
    for row in rows:
        value = _number(row.get(key))
        if value is not None:
            by_step[int(row["step"])] = value
    steps = sorted(by_step)
    return Series(key, steps, [by_step[s] for s in steps])


def smoothed(values: Series, window: int = SMOOTH_WINDOW) -> Series:
    """Trailing ``window``-step mean: point ``i`` (from ``window - 1`` on) is the mean of values ``i-window+1..i``.
    Fewer than ``window`` points are returned unchanged."""
    if len(values.values) < window:
        return values
    y = values.values
    means = [sum(y[i - window + 1 : i + 1]) / window for i in range(window - 1, len(y))]
    return Series(values.key, values.steps[window - 1 :], means)


def curve_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Series]]:
    """What each panel of ``metrics.png`` plots: ``{"score": [critic/score/mean, val-core/*...],
    "response length": [response_length/mean], "KL": [the KL metrics present]}``; a metric without any
    finite value is left out (a panel may be empty)."""
    val_keys = sorted({k for row in rows for k in row if k.startswith(VAL_PREFIX)})
    panels = {
        "score": [series(rows, k) for k in (SCORE_KEY, *val_keys)],
        "response length": [series(rows, LENGTH_KEY)],
        "KL": [series(rows, k) for k in KL_KEYS],
    }
    return {name: [s for s in items if s.steps] for name, items in panels.items()}


def sft_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Series]] | None:
    """The :data:`SFT_PANELS` series of an SFT run's rows; ``None`` for an RL run (a ``critic/score/mean``
    value) or rows without any ``train/loss`` value. A metric without any finite value is left out."""
    if series(rows, SCORE_KEY).steps or not series(rows, "train/loss").steps:
        return None
    panels = {name: [series(rows, k) for k in keys] for name, keys in SFT_PANELS.items()}
    return {name: [s for s in items if s.steps] for name, items in panels.items()}


def matplotlib_available() -> bool:
    """Whether the ``plot`` extra (matplotlib) is installed; imports nothing."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def new_figure(panels: int, figsize: tuple[float, float]) -> tuple[Any, list[Any]]:
    """A matplotlib ``Figure`` on the Agg canvas with ``panels`` axes side by side (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def draw_score(
    ax: Any, rows: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]] | None = None, other_label: str = ""
) -> None:
    """The score panel: training score with markers, its 3-step mean, ``other``'s 3-step mean (dashed, for a
    comparison) and the ``val-core/*`` metrics."""
    panel = curve_series(rows)["score"]
    train = next((s for s in panel if s.key == SCORE_KEY), None)
    if train is not None:
        ax.plot(train.steps, train.values, marker="o", label=f"train score ({SCORE_KEY})")
        if len(train.steps) >= SMOOTH_WINDOW:
            mean = smoothed(train)
            ax.plot(mean.steps, mean.values, label=f"train score, {SMOOTH_WINDOW}-step mean")
    if other:
        theirs = series(other, SCORE_KEY)
        if theirs.steps:
            mean = smoothed(theirs)
            ax.plot(
                mean.steps, mean.values, linestyle="--", label=f"{other_label}: train score, {SMOOTH_WINDOW}-step mean"
            )
    for s in panel:
        if s.key != SCORE_KEY:
            ax.plot(s.steps, s.values, marker="s", label=s.key)
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _draw_lines(ax: Any, items: Sequence[Series], ylabel: str, empty: str) -> None:
    for s in items:
        ax.plot(s.steps, s.values, marker="." if len(s.steps) < 50 else None, label=s.key)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if items:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=8)


def save_figure(fig: Any, out_png: str | os.PathLike[str], dpi: int = 110) -> Path:
    """Write ``fig`` as PNG atomically (temp file + ``os.replace``): a viewer never sees half an image."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        fig.tight_layout()
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def plot_metrics(rows: Sequence[Mapping[str, Any]], out_png: str | os.PathLike[str], title: str = "") -> Path:
    """Draw the three panels of ``rows`` (``metrics.jsonl`` rows) into ``out_png``; returns its path.

    Raises:
        ImportError: matplotlib is not installed (``pip install './core[plot]'``).
    """
    fig, (score_ax, length_ax, kl_ax) = new_figure(3, figsize=(15, 4))
    panels = curve_series(rows)
    sft = sft_series(rows)
    if sft is not None:
        for ax, (name, items) in zip((score_ax, length_ax, kl_ax), sft.items(), strict=True):
            _draw_lines(ax, items, name, f"no {' / '.join(SFT_PANELS[name])} logged")
        if title:
            fig.suptitle(title)
        return save_figure(fig, out_png)
    draw_score(score_ax, rows)
    _draw_lines(length_ax, panels["response length"], "response length (tokens)", f"no {LENGTH_KEY} logged")
    _draw_lines(kl_ax, panels["KL"], "KL", "no KL metric logged (" + ", ".join(KL_KEYS) + ")")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_png)


class MetricsPlot:
    """Keeps ``{run_dir}/metrics.png`` in step with ``{run_dir}/metrics.jsonl``.

    :meth:`maybe_refresh` redraws when ``interval_s`` (default 60 s) passed since the last drawing, so the
    cost (about a second) stays a small share of any step length; :meth:`refresh` draws now (the end of a
    run). Without matplotlib it logs one info line naming the extra and does nothing. A failed drawing is
    logged as a warning and never stops training.

    Args:
        metrics_path: the ``metrics.jsonl`` to read.
        title: figure title (``"<project>/<experiment>"``).
        interval_s: least seconds between two automatic refreshes.
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        metrics_path: str | os.PathLike[str],
        title: str = "",
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics_path = Path(metrics_path)
        self.png_path = self.metrics_path.with_name(PNG_FILE)
        self.title = title
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self.enabled = matplotlib_available()
        if not self.enabled:
            logger.info(
                "no %s: matplotlib is not installed (pip install './core[plot]' to get the curves)", self.png_path
            )

    def maybe_refresh(self) -> Path | None:
        """Redraw if the interval passed since the last drawing (the first call starts the interval)."""
        now = self._clock()
        if self._last is None:
            self._last = now
            return None
        if now - self._last < self.interval_s:
            return None
        return self.refresh()

    def refresh(self) -> Path | None:
        """Redraw now from the file; returns the PNG path, or ``None`` (no matplotlib, no rows, or a failure)."""
        self._last = self._clock()
        if not self.enabled:
            return None
        rows = read_metrics(self.metrics_path)
        if not rows:
            return None
        try:
            return plot_metrics(rows, self.png_path, self.title)
        except Exception as exc:  # a plot must never end a training run
            logger.warning("could not draw %s: %s", self.png_path, exc)
            return None
