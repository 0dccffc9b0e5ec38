"""GSM8K as SFT rows: the question (with verl's step-by-step instruction) -> the worked solution ending in
``#### <answer>`` (verl ``examples/data_preprocess/gsm8k_multiturn_sft.py``).

Each row has ``messages`` (``[user: question + instruction, assistant: solution]``, for ``data.messages_key``),
the same text as plain strings ``question`` / ``answer`` (single-turn rows: ``data.prompt_key=question
data.response_key=answer``), ``data_source`` and ``extra_info {split, index}``. The default folder is verl's,
``~/data/gsm8k_sft``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl.data.gsm8k import SPLITS, _source_file, default_source_dir, iter_gsm8k_rows

logger = logging.getLogger(__name__)

DEFAULT_SFT_DIR = Path("~/data/gsm8k_sft")


def iter_gsm8k_sft_rows(path: str | Path, split: str, *, skip_bad_rows: bool = False) -> Iterator[dict[str, Any]]:
    """SFT rows of one GSM8K jsonl file (bad rows as :func:`verl.data.gsm8k.iter_gsm8k_rows` treats them)."""
    for row in iter_gsm8k_rows(path, split, skip_bad_rows=skip_bad_rows):
        question, answer = row["prompt"][0]["content"], row["extra_info"]["answer"]
        yield {
            "data_source": row["data_source"],
            "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
            "question": question,
            "answer": answer,
            "extra_info": {"split": split, "index": row["extra_info"]["index"]},
        }


def _schema() -> Any:
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("messages", pa.list_(message)),
            ("question", pa.string()),
            ("answer", pa.string()),
            ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
        ]
    )


def prepare_gsm8k_sft(
    out_dir: str | Path = DEFAULT_SFT_DIR, source_dir: str | Path | None = None, *, skip_bad_rows: bool = False
) -> dict[str, Path]:
    """Write ``{out_dir}/train.parquet`` and ``{out_dir}/test.parquet`` of SFT rows; returns ``{split: path}``.

    Raises:
        FileNotFoundError: a split's source file is missing (names the folder).
        GSM8KFormatError: a malformed row (names ``file:line``), unless ``skip_bad_rows``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = default_source_dir() if source_dir is None else Path(source_dir).expanduser()
    files = {split: _source_file(src, split) for split in SPLITS}
    missing = [split for split, path in files.items() if path is None]
    if missing:
        raise FileNotFoundError(f"GSM8K source for split(s) {missing} not found in {src} (expected <split>.jsonl[.gz])")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for split, path in files.items():
        table = pa.Table.from_pylist(
            list(iter_gsm8k_sft_rows(path, split, skip_bad_rows=skip_bad_rows)), schema=_schema()
        )
        dest = out / f"{split}.parquet"
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        logger.info("wrote %d %s SFT rows to %s", table.num_rows, split, dest)
        result[split] = dest
    return result
