"""The ``file`` tracking backend: ``{run_dir}/metrics.jsonl``, one JSON object per step, written crash-safely.

Each :meth:`FileBackend.log` appends one line ``{"step": N, <metric>: value, ...}`` (NaN/inf as ``null``) and
fsyncs it, so a step's row is on disk before anything that runs after it (validation, the export) can fail.
:meth:`FileBackend.update` adds metrics to the last row (validation results of the step just logged): the merged
row is first written to the journal ``metrics.jsonl.merge`` (temp file + ``os.replace``), then the last line is
truncated and rewritten, then the journal is removed. A process killed at any point leaves either the old or the
merged row; the next :class:`FileBackend` of that folder finishes an interrupted merge from the journal. Cost per
update: one row written twice, whatever the length of the file.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from verl.trainer.trackers.values import to_json_safe

logger = logging.getLogger("verl.trainer.tracking")

METRICS_FILE = "metrics.jsonl"
GENERATIONS_FILE = "val_generations.jsonl"
MERGE_SUFFIX = ".merge"  # the journal of an update in progress: metrics.jsonl.merge

Sample = tuple[str, str, float]  # (input text, output text, score)


def step_ranges(steps: Sequence[int]) -> str:
    """Sorted step numbers as compact ranges for messages: ``[1, 2, 3, 7]`` -> ``"1-3, 7"``; ``[]`` -> ``""``."""
    spans: list[list[int]] = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _row_step(line: str) -> int | None:
    """The int ``"step"`` of a JSON-object line, else ``None`` (a torn or foreign line)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    step = value.get("step") if isinstance(value, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (JSON objects with an int ``"step"``) in file order; torn lines are
    skipped and a missing file gives ``[]``. Reads only: an interrupted merge is finished by :class:`FileBackend`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if _row_step(line) is not None]


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fp:
        fp.write(text)
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(tmp, path)


class FileBackend:
    """Append JSON lines to ``{run_dir}/metrics.jsonl`` (and samples to ``val_generations.jsonl``).

    Args:
        run_dir: the folder (created if missing). An interrupted :meth:`update` of an earlier process is finished
            first (from ``metrics.jsonl.merge``).
    """

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / METRICS_FILE
        self.generations_path = run_dir / GENERATIONS_FILE
        self.journal = run_dir / (METRICS_FILE + MERGE_SUFFIX)
        for stale in run_dir.glob(f"{self.journal.name}.tmp-*"):  # a journal never published: the merge never began
            stale.unlink(missing_ok=True)
        self._recover()
        self._fp: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across steps
        # (step, byte offset, row) of the file's last row, once known: what update() merges into.
        self._last: tuple[int, int, dict[str, Any]] | None = None

    def _open_fp(self) -> TextIO:
        if self._fp is None:
            raise ValueError(f"the file logger of {self.path} is closed")
        return self._fp

    def _append(self, row: Mapping[str, Any]) -> None:
        fp = self._open_fp()
        fp.flush()
        offset = os.fstat(fp.fileno()).st_size  # append mode: the row starts at the end of the file
        fp.write(json.dumps(row, allow_nan=False) + "\n")
        fp.flush()
        os.fsync(fp.fileno())
        self._last = (row["step"], offset, dict(row))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Append the row of ``step`` (``"step"`` first; NaN/inf as ``null``) and fsync it."""
        safe = to_json_safe(dict(data))
        self._append({"step": step, **{k: v for k, v in safe.items() if k != "step"}})

    def update(self, data: Mapping[str, Any], step: int) -> None:
        """Add ``data`` to the row of ``step`` when it is the file's last row (its keys win), else append a row.

        Crash-safe through the journal (module doc). Raises ValueError once closed.
        """
        fp = self._open_fp()
        fp.flush()
        last = self._last if self._last is not None else self._read_last_row()
        if last is None or last[0] != step:
            self.log(data, step)
            return
        _, offset, row = last
        safe = to_json_safe(dict(data))
        merged = {**row, **{k: v for k, v in safe.items() if k != "step"}}
        line = json.dumps(merged, allow_nan=False) + "\n"
        _write_atomically(self.journal, line)
        os.truncate(self.path, offset)
        fp.write(line)  # append mode: lands at the new end
        fp.flush()
        os.fsync(fp.fileno())
        self.journal.unlink()
        self._last = (step, offset, merged)

    def _read_last_row(self) -> tuple[int, int, dict[str, Any]] | None:
        """(step, byte offset, row) of the file's last line, or None (empty file, or a torn last line)."""
        size = self.path.stat().st_size
        if size == 0:
            return None
        with open(self.path, "rb") as fp:
            pos, tail = size, b""
            while True:  # read backwards until the newline before the last line (or the file's start)
                read = min(65536, pos)
                pos -= read
                fp.seek(pos)
                tail = fp.read(read) + tail
                if not tail.endswith(b"\n"):
                    return None  # the last line is torn: rewind() drops it
                cut = tail.rfind(b"\n", 0, len(tail) - 1)
                if cut >= 0 or pos == 0:
                    break
        line = tail[cut + 1 : -1].decode("utf-8", errors="replace")
        step = _row_step(line)
        return None if step is None else (step, pos + cut + 1, json.loads(line))

    def _recover(self) -> None:
        """Finish an update a killed process left in the journal: its row replaces the last row of its step."""
        if not self.journal.exists():
            return
        text = self.journal.read_text(encoding="utf-8")
        step = _row_step(text.strip())
        lines = self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []
        if step is not None:
            while lines and (_row_step(lines[-1]) in (None, step)):
                lines.pop()  # the row being replaced, or a line torn by the kill
            lines.append(text.strip())
            _write_atomically(self.path, "".join(line + "\n" for line in lines))
            logger.warning(
                "%s: finished the update of step %d that a stopped process left in %s", self.path, step, self.journal
            )
        self.journal.unlink()

    def rows(self) -> list[dict[str, Any]]:
        """Every row of the file (JSON objects with an int ``"step"``), in file order; torn lines are skipped."""
        self._open_fp().flush()
        return read_rows(self.path)

    def rewind(self, step: int) -> int:
        """Keep only the rows a run starting at ``step`` will not write again; returns how many were dropped.

        ``step > 0`` (resumed from ``global_step_{step}``): rows with ``"step" <= step`` stay. ``step == 0``
        (from scratch): every row goes. Lines that are not a JSON object with an int ``"step"`` (a line torn
        by a kill mid-write) are dropped too. The file is replaced atomically (temp file + ``os.replace``).
        Logs a warning when a resumed run's file lacks rows up to ``step`` (a process stopped after saving
        a checkpoint but before logging its step: those rows cannot be recovered).
        """
        fp = self._open_fp()
        fp.flush()
        kept: list[str] = []
        dropped = 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            row_step = _row_step(line)
            if row_step is not None and step > 0 and row_step <= step:
                kept.append(line)
            else:
                dropped += 1 if line.strip() else 0
        logged = {_row_step(line) for line in kept}
        missing = [s for s in range(1, step + 1) if s not in logged]
        if logged and missing:
            logger.warning("%s has no rows for steps %s (stopped before logging them)", self.path, step_ranges(missing))
        if dropped == 0:
            return 0
        fp.close()
        _write_atomically(self.path, "".join(line + "\n" for line in kept))
        self._fp = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across steps
        self._last = None
        logger.info("%s: dropped %d rows after step %d (those steps run again)", self.path, dropped, step)
        return dropped

    def log_generations(self, samples: Sequence[Sample], step: int) -> None:
        with open(self.generations_path, "a", encoding="utf-8") as fp:
            for inp, out, score in samples:
                record = {"step": step, "input": str(inp), "output": str(out), "score": to_json_safe(float(score))}
                fp.write(json.dumps(record, allow_nan=False) + "\n")

    def close(self, exit_code: int = 0) -> None:
        if self._fp is not None:
            self._fp.close()
            self._fp = None
