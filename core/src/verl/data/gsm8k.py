"""GSM8K -> verl parquet (the ``verl data gsm8k`` command).

Mirrors verl's ``examples/data_preprocess/gsm8k.py``: every row becomes

* ``data_source``: ``"openai/gsm8k"``
* ``prompt``: ``[{"role": "user", "content": question + " " + INSTRUCTION}]``
* ``ability``: ``"math"``
* ``reward_model``: ``{"style": "rule", "ground_truth": <number after "####", commas removed>}``
* ``extra_info``: ``{"split", "index", "answer", "question"}``

With a tool (``tool="code_interpreter"`` or ``"calc_gsm8k_reward"``, CLI ``--tools``) the rows are verl's
multi-turn ones (``examples/data_preprocess/gsm8k_multiturn_w_tool.py``): ``agent_name``, a system message
offering the tool, and ``extra_info.{need_tools_kwargs, tools_kwargs, interaction_kwargs}``
(:mod:`verl.data.gsm8k_tools`).

The source jsonl files (``{"question", "answer"}`` per line, MIT licence, OpenAI 2021) ship
gzip-compressed inside this package (``verl/data/assets/gsm8k/``) so that wheels carry them;
``examples/data/gsm8k/`` in the repository links to the same files.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from verl.data import gsm8k_tools

logger = logging.getLogger(__name__)

DATA_SOURCE = "openai/gsm8k"
# verl's examples/data_preprocess/gsm8k.py wording, byte for byte.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
# verl's extract_solution regex: the signed number (digits, dots, commas) after "#### ".
_SOLUTION_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_GZIP_MAGIC = b"\x1f\x8b"

_PACKAGE_DIR = Path(__file__).resolve().parent / "assets" / "gsm8k"


def _repo_examples_dir() -> Path | None:
    # core/src/verl/data/gsm8k.py -> parents[4] is the repository root in a source checkout.
    parents = Path(__file__).resolve().parents
    return parents[4] / "examples" / "data" / "gsm8k" if len(parents) > 4 else None


class GSM8KFormatError(ValueError):
    """A source row is not valid GSM8K (bad JSON, missing/non-string field, no ``#### <number>``)."""


def extract_solution(answer: str) -> str:
    """Return the final answer of a GSM8K solution: the number after ``"#### "``, commas removed.

    Same rule as verl's ``extract_solution`` (``examples/data_preprocess/gsm8k.py``):
    ``"...\\n#### 1,234"`` -> ``"1234"``. Raises :class:`GSM8KFormatError` when there is none.
    """
    match = _SOLUTION_RE.search(answer)
    if match is None:
        raise GSM8KFormatError('answer has no final "#### <number>" line')
    return match.group(1).replace(",", "")


def _source_file(source_dir: Path, split: str) -> Path | None:
    for name in (f"{split}.jsonl.gz", f"{split}.jsonl"):
        path = source_dir / name
        if path.is_file():
            return path
    return None


def _usable(source_dir: Path) -> bool:
    for split in SPLITS:
        path = _source_file(source_dir, split)
        if path is None:
            return False
        # A checkout without symlink support leaves a text file holding the link target: skip it.
        if path.suffix == ".gz":
            with open(path, "rb") as f:
                if f.read(2) != _GZIP_MAGIC:
                    return False
    return True


def default_source_dir() -> Path:
    """Return the folder holding the GSM8K ``{train,test}.jsonl.gz`` sources.

    Looks at ``examples/data/gsm8k`` of the source checkout first (editable installs), then at
    the copy packaged in ``verl/data/assets/gsm8k`` (wheels). Raises ``FileNotFoundError``
    listing both places when neither holds the two splits.
    """
    candidates = [d for d in (_repo_examples_dir(), _PACKAGE_DIR) if d is not None]
    for candidate in candidates:
        if candidate.is_dir() and _usable(candidate):
            return candidate
    raise FileNotFoundError(
        f"GSM8K source files not found in {' nor in '.join(map(str, candidates))}; "
        "pass source_dir (CLI: --source DIR) pointing at a folder with train.jsonl[.gz] and test.jsonl[.gz]"
    )


def _open_text(path: Path) -> Any:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _to_row(record: Any, split: str, index: int, tool: str | None) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise GSM8KFormatError(f"expected a JSON object, got {type(record).__name__}")
    for field in ("question", "answer"):
        if field not in record:
            raise GSM8KFormatError(f"missing field {field!r}")
        if not isinstance(record[field], str):
            raise GSM8KFormatError(f"field {field!r} must be a string, got {type(record[field]).__name__}")
    question, answer = record["question"], record["answer"]
    query, solution = question + " " + INSTRUCTION, extract_solution(answer)
    extra = {"split": split, "index": index, "answer": answer, "question": question}
    if tool is None:
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": query}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": solution},
            "extra_info": extra,
        }
    extra.update(
        need_tools_kwargs=True,
        tools_kwargs=gsm8k_tools.tools_kwargs(tool, solution),
        interaction_kwargs=gsm8k_tools.interaction_kwargs(query, solution),
    )
    return {
        "data_source": DATA_SOURCE,
        "agent_name": gsm8k_tools.AGENT_NAME,
        "prompt": [
            {"role": "system", "content": gsm8k_tools.system_prompt(tool)},
            {"role": "user", "content": query},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": extra,
    }


def iter_gsm8k_rows(
    path: str | Path, split: str, *, skip_bad_rows: bool = False, tool: str | None = None
) -> Iterator[dict[str, Any]]:
    """Yield verl-format rows from one GSM8K jsonl (optionally ``.gz``) file.

    ``extra_info.index`` is the 0-based position of the record among the file's non-blank lines,
    so it maps back to the source even when bad rows are skipped. ``tool`` (one of
    :data:`verl.data.gsm8k_tools.TOOLS`) gives verl's multi-turn tool rows (module docstring).

    Raises:
        ValueError: ``tool`` is not a known tool (before the file is opened).
        GSM8KFormatError: on the first bad row, naming ``file:line`` and the problem, unless
            ``skip_bad_rows``; then bad rows are dropped and a warning logs their count.
    """
    if tool is not None:
        gsm8k_tools.check_tool(tool)
    path = Path(path)
    skipped: list[str] = []
    index = 0
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise GSM8KFormatError(f"invalid JSON ({exc.msg})") from None
                row = _to_row(record, split, index, tool)
            except GSM8KFormatError as exc:
                where = f"{path}:{lineno}: {exc}"
                if not skip_bad_rows:
                    raise GSM8KFormatError(f"{where} (fix the row, or pass skip_bad_rows=True to drop it)") from None
                skipped.append(where)
            else:
                yield row
            index += 1
    if skipped:
        logger.warning("skipped %d bad GSM8K row(s) in %s; first: %s", len(skipped), path, skipped[0])


def _schema(tool: str | None) -> Any:
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    extra = [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
    if tool is not None:
        extra += gsm8k_tools.extra_info_fields(tool)
    head = [("data_source", pa.string())] + ([] if tool is None else [("agent_name", pa.string())])
    return pa.schema(
        [
            *head,
            ("prompt", pa.list_(message)),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct(extra)),
        ]
    )


def write_parquet(rows: Iterable[dict[str, Any]], path: str | Path, *, tool: str | None = None) -> int:
    """Write verl-format GSM8K rows to ``path`` atomically (temp file + rename); return the row count.

    ``tool`` must be the one the rows were made with (it picks the parquet schema); ``ValueError`` if unknown.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.Table.from_pylist(list(rows), schema=_schema(tool))
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return table.num_rows


def prepare_gsm8k(
    out_dir: str | Path,
    source_dir: str | Path | None = None,
    *,
    skip_bad_rows: bool = False,
    tool: str | None = None,
) -> dict[str, Path]:
    """Convert GSM8K to ``{out_dir}/train.parquet`` and ``{out_dir}/test.parquet`` in verl's columns.

    Args:
        out_dir: created if missing; existing parquet files there are replaced.
        source_dir: folder with ``train.jsonl[.gz]`` and ``test.jsonl[.gz]``;
            default :func:`default_source_dir` (the shipped copy: 7473 train / 1319 test rows).
        skip_bad_rows: drop malformed rows (count logged) instead of raising.
        tool: ``None`` for the plain single-turn rows, or ``"code_interpreter"`` / ``"calc_gsm8k_reward"`` for
            verl's multi-turn tool rows (:mod:`verl.data.gsm8k_tools`; default folder
            ``~/data/gsm8k_tool_<tool>``, :func:`verl.data.gsm8k_tools.default_out_dir`).

    Returns:
        ``{"train": path, "test": path}``.

    Raises:
        ValueError: ``tool`` is not a known tool (names the choices), before anything is read or written.
        FileNotFoundError: a split's source file is missing (names the folder).
        GSM8KFormatError: a malformed row (names ``file:line``), unless ``skip_bad_rows``.
    """
    if tool is not None:
        gsm8k_tools.check_tool(tool)
    src = default_source_dir() if source_dir is None else Path(source_dir).expanduser()
    out = Path(out_dir).expanduser()
    files = {}
    for split in SPLITS:
        path = _source_file(src, split)
        if path is None:
            raise FileNotFoundError(
                f"GSM8K source for split {split!r} not found: expected {src / (split + '.jsonl.gz')} "
                f"or {src / (split + '.jsonl')}"
            )
        files[split] = path
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for split, path in files.items():
        dest = out / f"{split}.parquet"
        n = write_parquet(iter_gsm8k_rows(path, split, skip_bad_rows=skip_bad_rows, tool=tool), dest, tool=tool)
        logger.info("wrote %d %s rows to %s", n, split, dest)
        result[split] = dest
    return result
