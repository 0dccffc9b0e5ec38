"""Reading and checking dataset rows in verl's column format (anatomy §9.3), before tokenization.

Every problem is reported with the file, the row index inside that file, the field and the fix, so a bad
row in a 100k-row parquet file is found without a debugger. File-level problems (missing, unreadable,
unsupported suffix) always raise; row-level problems raise :class:`PromptFormatError` unless the caller
opts into skipping them (``data.skip_bad_rows``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SKIP_HINT = "fix the row, or set data.skip_bad_rows=true to drop bad rows (counted in data/skipped_rows)"


class PromptFormatError(ValueError):
    """A dataset row is unusable (missing prompt column, empty prompt, wrong type); the message names
    file, row, field and the fix."""


def read_rows(data_files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[dict[str, Any], str, int]]:
    """Read ``.parquet``, ``.jsonl`` or ``.jsonl.gz`` files; return ``(row, file, row_in_file)`` triples.

    Raises:
        FileNotFoundError: a file does not exist (names it).
        ValueError: no files, a folder instead of a file, an unknown suffix, a parquet file that cannot be
            read (corrupt, or not parquet despite its name), or a jsonl line that is not a JSON object
            (naming file and line).
    """
    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not files:
        raise ValueError("data_files is empty: set data.train_files to at least one .parquet or .jsonl file")
    out: list[tuple[dict[str, Any], str, int]] = []
    for file in files:
        path = Path(file).expanduser()
        if path.is_dir():
            raise ValueError(f"dataset path {path} is a folder; list the .parquet/.jsonl files inside it instead")
        if not path.is_file():
            raise FileNotFoundError(
                f"dataset file not found: {path} (check data.train_files / data.val_files; "
                "`verl data gsm8k` writes the GSM8K files)"
            )
        name = path.name.lower()
        if name.endswith(".parquet"):
            rows = _read_parquet(path)
        elif name.endswith((".jsonl", ".jsonl.gz")):
            rows = _read_jsonl(path)
        else:
            raise ValueError(f"unsupported dataset file {path}: expected .parquet, .jsonl or .jsonl.gz")
        out.extend((row, str(path), i) for i, row in enumerate(rows))
    return out


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(
            f"cannot read {path} as parquet ({type(exc).__name__}: {exc}); the file is corrupt or not parquet: "
            "rewrite it with pandas.DataFrame.to_parquet / pyarrow.parquet.write_table, or use .jsonl"
        ) from None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg}); one JSON object per line") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                rows.append(row)
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise ValueError(f"cannot read {path} as UTF-8 jsonl ({type(exc).__name__}: {exc})") from None
    return rows


def check_messages(row: dict[str, Any], key: str, file: str, row_in_file: int) -> list[dict[str, Any]]:
    """Return the chat messages of ``row[key]`` as a list of ``{"role": str, "content": str}`` dicts.

    Raises:
        PromptFormatError: the column is missing/null, not a non-empty list, a message is not a
            ``{role: str, content: str}`` dict, or a message's content is empty/whitespace.
    """
    where = f"{file} row {row_in_file}, field {key!r}"
    if key not in row or row[key] is None:
        raise PromptFormatError(
            f"{where}: missing; columns present: {sorted(row)} (set data.prompt_key to the column holding the "
            f"chat messages, or {SKIP_HINT})"
        )
    messages = row[key]
    if isinstance(messages, np.ndarray):
        messages = messages.tolist()
    if not isinstance(messages, list) or not messages:
        raise PromptFormatError(
            f"{where}: expected a non-empty list of chat messages "
            f'[{{"role": ..., "content": ...}}], got {_describe(messages)}; {SKIP_HINT}'
        )
    for j, msg in enumerate(messages):
        ok = isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)
        if not ok:
            raise PromptFormatError(f"{where}[{j}]: expected {{'role': str, 'content': str}}, got {msg!r:.200}")
        if not msg["content"].strip():
            raise PromptFormatError(f"{where}[{j}]['content']: empty prompt text (role {msg['role']!r}); {SKIP_HINT}")
    return messages


def check_reward_model(row: dict[str, Any], file: str, row_in_file: int) -> None:
    """Check ``row["reward_model"]`` when the row has that column (verl: ``{style, ground_truth: str}``).

    A row without the column is accepted (runs scored by a learned reward model need no ground truth);
    a row that has it must hold a dict whose ``ground_truth`` is a string or a finite number.

    Raises:
        PromptFormatError: null / non-dict ``reward_model``, missing ``ground_truth``, or a ground truth that is
            null, a list/dict/bool or a non-finite number.
    """
    if "reward_model" not in row:
        return
    where = f"{file} row {row_in_file}, field 'reward_model'"
    value = row["reward_model"]
    if not isinstance(value, dict):
        raise PromptFormatError(
            f"{where}: expected a dict like {{'style': 'rule', 'ground_truth': '42'}}, got {_describe(value)}; "
            f"{SKIP_HINT}"
        )
    if "ground_truth" not in value:
        raise PromptFormatError(f"{where}: no 'ground_truth' key (keys: {sorted(value)}); {SKIP_HINT}")
    truth = value["ground_truth"]
    number = isinstance(truth, (int, float, np.integer, np.floating)) and not isinstance(truth, (bool, np.bool_))
    if isinstance(truth, str) or (number and math.isfinite(float(truth))):
        return
    raise PromptFormatError(
        f"{where}.ground_truth: expected a string (or a finite number) such as '42', got {_describe(truth)}; "
        f"store the reference answer as text; {SKIP_HINT}"
    )


@dataclass(frozen=True)
class RewardColumns:
    """The columns the reward manager reads from every row, checked when the dataset loads (not after generation).

    The manager (:class:`verl.rewards.RewardManager`) reads the data source from ``source_key`` and the reference
    answer from ``reward_model["ground_truth"]`` for every sample, whichever function scores it; ``extra_info`` is
    optional. What a custom reward function does with them is its own business and is not checked.

    Attributes:
        source_key: the data-source column (``data.reward_fn_key``); present and non-null in every row.
        also: further columns that must be present and non-null (validation groups its metrics by ``data_source``).
        check_source: called once per distinct data source; raises ``ValueError`` (its message says why and what
            to do) for a source nothing can score, e.g. the built-in scorers' ``check_data_source``. ``None``: any.
        reader: who reads the columns, for messages (``"the reward function (validation)"``).
        alternative: another way out than fixing the rows, appended to messages (``""``: none).
    """

    source_key: str = "data_source"
    also: tuple[str, ...] = ()
    check_source: Callable[[str], None] | None = None
    reader: str = "the reward function"
    alternative: str = ""

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column checked: the source column, ``also``, then ``reward_model``."""
        return tuple(dict.fromkeys((self.source_key, *self.also, "reward_model")))

    def fix(self, column: str) -> str:
        what = (
            "a dict {'style': 'rule', 'ground_truth': <reference answer>} (`verl data gsm8k` writes it)"
            if column == "reward_model"
            else "the name of the row's data set (e.g. 'openai/gsm8k'; set data.reward_fn_key to another column)"
        )
        alternative = f", or {self.alternative}" if self.alternative else ""
        return f"add a {column!r} column holding {what}{alternative}"


def check_reward_columns(rows: Sequence[tuple[dict[str, Any], str, int]], spec: RewardColumns) -> None:
    """File-level half of :class:`RewardColumns`: each file has every column in at least one row, and every data
    source passes ``spec.check_source``. Always raises, whatever ``data.skip_bad_rows`` says (no row would be left).

    Raises:
        PromptFormatError: a file lacks a column (absent or null in every row): names the file, the column, the
            columns it has and the fix; or a data source that ``check_source`` refuses (first row named).
    """
    by_file: dict[str, list[dict[str, Any]]] = {}
    for row, file, _ in rows:
        by_file.setdefault(file, []).append(row)
    for file, file_rows in by_file.items():
        for column in spec.columns:
            if all(row.get(column) is None for row in file_rows):
                present = sorted({key for row in file_rows for key in row})
                raise PromptFormatError(
                    f"{file}: no {column!r} column (columns: {present}); {spec.reader} reads it from every row, "
                    f"so every sample would fail after generation: {spec.fix(column)}"
                )
    if spec.check_source is None:
        return
    checked: set[str] = set()
    for row, file, i in rows:
        source = row.get(spec.source_key)
        if source is None or str(source) in checked:
            continue
        checked.add(str(source))
        try:
            spec.check_source(str(source))
        except ValueError as exc:
            raise PromptFormatError(f"{file} row {i}, field {spec.source_key!r}: {exc}") from None


def check_reward_row(row: dict[str, Any], file: str, row_in_file: int, spec: RewardColumns) -> None:
    """Row-level half of :class:`RewardColumns`: the row holds every column (non-null) and a valid ``reward_model``.

    Raises:
        PromptFormatError: a column is missing or null in this row (skippable with ``data.skip_bad_rows``), or
            :func:`check_reward_model` fails.
    """
    for column in spec.columns:
        if row.get(column) is None:
            raise PromptFormatError(
                f"{file} row {row_in_file}, field {column!r}: missing or null, but {spec.reader} reads it from "
                f"every row: {spec.fix(column)}; {SKIP_HINT}"
            )
    check_reward_model(row, file, row_in_file)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.80}"
