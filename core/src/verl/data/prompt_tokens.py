"""Render chat prompts with the tokenizer's chat template and tokenise them, in one or several processes.

verl's ``RLHFDataset`` spreads the prompt-length filter over ``data.filter_overlong_prompts_workers``
processes (``datasets.Dataset.filter(num_proc=...)``, ``verl/utils/dataset/rl_dataset.py``). Here every prompt
is rendered and tokenised once when the dataset is built, so the same key spreads that work: the rows are cut
into contiguous slices, each slice is encoded in a worker process, and the results are joined in row order, so
the token ids are the same as in one process. The Jinja rendering is pure Python (bound by the GIL), which is
why threads would not help.

No torch import here: a spawned worker loads only this module and the tokenizer.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

# One prompt's result: its token ids, or the text of the error its chat template raised.
Encoded = list[int] | str


def encode_prompts(tokenizer: Any, messages: Sequence[Any], template_kwargs: Mapping[str, Any]) -> list[Encoded]:
    """Render each chat with ``add_generation_prompt=True`` and tokenise it without special tokens.

    Args:
        tokenizer: a HF tokenizer with a chat template.
        messages: one list of ``{role, content}`` messages per prompt.
        template_kwargs: extra ``apply_chat_template`` kwargs (``data.apply_chat_template_kwargs``).

    Returns:
        per prompt, in order: its token ids, or the error message of a template that failed on it.
    """
    texts: list[str | None] = []
    errors: dict[int, str] = {}
    for j, msgs in enumerate(messages):
        try:
            texts.append(
                tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **template_kwargs)
            )
        except Exception as exc:  # a Jinja error: reported per row by the caller (file, row, field)
            errors[j] = str(exc) or type(exc).__name__
            texts.append(None)
    good = [t for t in texts if t is not None]
    ids = iter(tokenizer(good, add_special_tokens=False)["input_ids"] if good else [])
    return [errors[j] if t is None else list(next(ids)) for j, t in enumerate(texts)]


def encode_prompts_parallel(
    tokenizer: Any, messages: Sequence[Any], template_kwargs: Mapping[str, Any], workers: int
) -> list[Encoded]:
    """:func:`encode_prompts` over ``workers`` processes (contiguous slices, results in row order).

    ``workers <= 1``, or fewer than two prompts per worker, encodes in this process. Workers are spawned (not
    forked: a forked tokenizer that already ran its thread pool can deadlock).

    Raises:
        ValueError: ``workers`` is not an int >= 1 (``data.filter_overlong_prompts_workers``).
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"data.filter_overlong_prompts_workers must be a process count >= 1, got {workers!r}")
    workers = min(workers, len(messages) // 2)
    if workers <= 1:
        return encode_prompts(tokenizer, messages, template_kwargs)
    size = -(-len(messages) // workers)
    slices = [list(messages[i : i + size]) for i in range(0, len(messages), size)]
    kwargs = dict(template_kwargs)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=len(slices), mp_context=ctx) as pool:
        parts = pool.map(encode_prompts, [tokenizer] * len(slices), slices, [kwargs] * len(slices))
        return [item for part in parts for item in part]
