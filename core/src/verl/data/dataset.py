"""Prompt dataset in verl's parquet/jsonl column format (anatomy §9.3).

Follows verl's ``verl/utils/dataset/rl_dataset.py`` (``RLHFDataset``) and
``verl/utils/model.py::compute_position_id_with_mask``: the chat template is applied with
``add_generation_prompt=True``, the rendered text is tokenized without special tokens, prompts are
LEFT-padded to ``max_prompt_length`` and ``position_ids = clip(cumsum(attention_mask) - 1, min=0)``.

Unlike verl, every prompt is tokenized once when the dataset is built, so filtering counts,
truncation counts and ``truncation="error"`` failures are known before training starts instead of
surfacing mid-run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.data.prompt_cache import cached_encode
from verl.data.rows import (
    PromptFormatError,
    RewardColumns,
    check_messages,
    check_reward_columns,
    check_reward_model,
    check_reward_row,
    read_rows,
)

__all__ = [
    "ChatTemplateError",
    "PromptFormatError",
    "PromptTooLongError",
    "RLHFDataset",
    "RewardColumns",
    "TRUNCATION_MODES",
    "collate_fn",
    "collate_to_dicts",
    "compute_position_ids",
    "read_rows",
    "truncate_ids",
]

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")


class ChatTemplateError(ValueError):
    """The tokenizer cannot render chat messages (no chat template)."""


class PromptTooLongError(ValueError):
    """A prompt exceeds ``max_prompt_length`` while ``truncation="error"`` and filtering is off."""


def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: ``clip(cumsum(mask, -1) - 1, min=0)``.

    Shape and dtype follow ``attention_mask`` (``(..., seq_len)``); pad positions get 0.
    Source: verl ``verl/utils/model.py::compute_position_id_with_mask``.
    Example (known-failures K07): mask ``[0, 0, 1, 1, 1]`` -> ``[0, 0, 0, 1, 2]``.
    """
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


def truncate_ids(ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens as verl's ``tokenize_and_postprocess_data`` does.

    ``left`` keeps the last tokens, ``right`` the first, ``middle`` the first ``max_length // 2``
    and the last ``max_length - max_length // 2``. Raises ``ValueError`` for ``error`` or an unknown mode.
    """
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[len(ids) - max_length :]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        left = max_length // 2
        right = max_length - left
        return ids[:left] + ids[len(ids) - right :]
    raise ValueError(f"cannot truncate with truncation={mode!r}; use one of {TRUNCATION_MODES[1:]}")


def _cfg(config: Any, name: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    return default if value is None else value


class RLHFDataset:
    """Tokenized, left-padded chat prompts with their reward columns.

    Args:
        data_files: one path or a list of ``.parquet`` / ``.jsonl`` / ``.jsonl.gz`` files (rows concatenated).
        tokenizer: a HF tokenizer with a chat template.
        config: the ``data`` config section (attrs object, mapping or ``SimpleNamespace``). Read:
            ``prompt_key`` ("prompt"), ``max_prompt_length`` (512), ``filter_overlong_prompts`` (False),
            ``truncation`` ("error" | "left" | "right" | "middle"), ``return_raw_chat`` (True),
            ``apply_chat_template_kwargs`` ({}), ``skip_bad_rows`` (False; not a verl key),
            ``filter_overlong_prompts_workers`` (1: processes that render and tokenise the prompts,
            :mod:`verl.data.prompt_tokens`; the result does not depend on it); other defaults are verl's.
        max_samples: keep only the first ``max_samples`` rows when > 0 (``data.train_max_samples`` /
            ``data.val_max_samples``; -1 = all).
        reward_columns: what the reward manager will read from every row (:class:`RewardColumns`), checked
            here so a dataset it cannot score fails at load, not after generation; ``None`` checks only that a
            ``reward_model`` column, where present, is well formed.

    Each item is a dict: ``input_ids``, ``attention_mask``, ``position_ids`` (int64 tensors of shape
    ``(max_prompt_length,)``, left-padded with the pad id / 0), ``raw_prompt`` (the chat messages, when
    ``return_raw_chat``), ``index`` (``extra_info["index"]`` or the row's position in the files) and every
    other column of the row (``data_source``, ``ability``, ``reward_model``, ``extra_info``, ...).

    Attributes:
        num_rows_read: rows read from the files (after ``max_samples``).
        num_skipped: bad rows dropped because ``skip_bad_rows`` is on (logged; ``skipped`` holds the first
            20 reasons). With it off, the first bad row raises.
        num_filtered: rows dropped because their prompt is longer than ``max_prompt_length``
            (``filter_overlong_prompts=True``; logged).
        num_truncated: rows cut by ``truncation`` left/right/middle (logged).
        stats: the three counts keyed as trainer metrics (``data/skipped_rows``, ...).

    Raises:
        ChatTemplateError: the tokenizer has no chat template.
        PromptFormatError: a row lacks the prompt column, its prompt is not a non-empty list of
            ``{role, content}`` with non-blank content, or its ``reward_model`` is not a dict with a string
            ``ground_truth`` (file, row, field and fix named) -- unless ``skip_bad_rows``; with
            ``reward_columns``, a row lacking one of its columns (skippable too), a file lacking one in every row
            or a data source its ``check_source`` refuses (never skipped).
        FileNotFoundError: a data file is missing.
        PromptTooLongError: a prompt is too long with ``truncation="error"`` and filtering off.
        ValueError: bad ``truncation`` / ``max_prompt_length``, unreadable/corrupt files, or no rows left.
    """

    def __init__(
        self,
        data_files: Any,
        tokenizer: Any,
        config: Any = None,
        max_samples: int = -1,
        reward_columns: RewardColumns | None = None,
    ):
        self.tokenizer = tokenizer
        self.prompt_key: str = _cfg(config, "prompt_key", "prompt")
        self.max_prompt_length: int = int(_cfg(config, "max_prompt_length", 512))
        self.filter_overlong_prompts: bool = bool(_cfg(config, "filter_overlong_prompts", False))
        self.truncation: str = _cfg(config, "truncation", "error")
        self.return_raw_chat: bool = bool(_cfg(config, "return_raw_chat", True))
        self.apply_chat_template_kwargs: dict[str, Any] = dict(_cfg(config, "apply_chat_template_kwargs", {}))
        self.skip_bad_rows: bool = bool(_cfg(config, "skip_bad_rows", False))
        self.image_key: str = _cfg(config, "image_key", "images")
        self.workers: int = _cfg(config, "filter_overlong_prompts_workers", 1)
        self.reward_columns = reward_columns
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r} is not one of {TRUNCATION_MODES}")
        if self.max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be a positive token count, got {self.max_prompt_length}")
        self.pad_token_id = self._check_tokenizer(tokenizer)

        rows = read_rows(data_files)
        if max_samples is not None and max_samples > 0:
            rows = rows[:max_samples]
        self.num_rows_read = len(rows)
        _refuse_images(rows, self.image_key)
        if reward_columns is not None:
            check_reward_columns(rows, reward_columns)
        rows, messages, ids = self._checked_rows(rows)

        columns = list(dict.fromkeys(k for row, _, _ in rows for k in row if k != self.prompt_key))
        self.num_filtered = 0
        self.num_truncated = 0
        self._rows: list[dict[str, Any]] = []
        self._ids: list[list[int]] = []
        for position, ((row, file, i), msgs, tokens) in enumerate(zip(rows, messages, ids, strict=True)):
            if len(tokens) > self.max_prompt_length:
                if self.filter_overlong_prompts:
                    self.num_filtered += 1
                    continue
                if self.truncation == "error":
                    raise PromptTooLongError(
                        f"{file} row {i} (dataset row {position}): prompt is {len(tokens)} tokens > "
                        f"data.max_prompt_length={self.max_prompt_length}; raise max_prompt_length, set "
                        "data.filter_overlong_prompts=True, or data.truncation=left|right|middle"
                    )
                tokens = truncate_ids(tokens, self.max_prompt_length, self.truncation)
                self.num_truncated += 1
            item = {k: row.get(k) for k in columns}
            extra = item.get("extra_info")
            index = extra.get("index") if isinstance(extra, dict) else None
            item["index"] = position if index is None else index
            if self.return_raw_chat:
                item["raw_prompt"] = msgs
            self._rows.append(item)
            self._ids.append(tokens)
        self._log_counts()
        if not self._rows:
            raise ValueError(
                f"no rows left in {data_files}: read {self.num_rows_read}, skipped {self.num_skipped} bad, "
                f"filtered {self.num_filtered} over max_prompt_length={self.max_prompt_length}"
            )

    @property
    def stats(self) -> dict[str, int]:
        """Row counts for metrics: ``data/skipped_rows``, ``data/filtered_prompts``, ``data/truncated_prompts``."""
        return {
            "data/skipped_rows": self.num_skipped,
            "data/filtered_prompts": self.num_filtered,
            "data/truncated_prompts": self.num_truncated,
        }

    def _checked_rows(self, rows: list[tuple[dict, str, int]]) -> tuple[list, list, list]:
        """Validate and tokenize each row; a bad row raises, or is dropped and counted when skipping."""
        self.num_skipped = 0
        self.skipped: list[str] = []  # the first reasons, for the log and for users inspecting the dataset
        kept, messages = [], []
        for row, file, i in rows:
            try:
                msgs = check_messages(row, self.prompt_key, file, i)
                if self.reward_columns is None:
                    check_reward_model(row, file, i)
                else:
                    check_reward_row(row, file, i, self.reward_columns)
            except PromptFormatError as exc:
                self._skip_or_raise(exc)
                continue
            kept.append((row, file, i))
            messages.append(msgs)
        encoded = cached_encode(self.tokenizer, messages, self.apply_chat_template_kwargs, self.workers)
        ok = []
        for result, (_, file, i) in zip(encoded, kept, strict=True):
            ok.append(not isinstance(result, str))
            if isinstance(result, str):  # the chat template failed on this row
                self._skip_or_raise(
                    ChatTemplateError(
                        f"{file} row {i}: the chat template failed on field {self.prompt_key!r}: {result}"
                    )
                )
        kept = [r for r, good in zip(kept, ok, strict=True) if good]
        messages = [m for m, good in zip(messages, ok, strict=True) if good]
        ids = [e for e, good in zip(encoded, ok, strict=True) if good]
        return kept, messages, ids

    def _skip_or_raise(self, exc: ValueError) -> None:
        if not self.skip_bad_rows:
            raise exc
        self.num_skipped += 1
        if len(self.skipped) < 20:
            self.skipped.append(str(exc))

    def _log_counts(self) -> None:
        total = self.num_rows_read
        if self.num_skipped:
            logger.warning(
                "skipped %d of %d rows (data.skip_bad_rows=true); first: %s", self.num_skipped, total, self.skipped[0]
            )
        if self.num_filtered:
            logger.warning(
                "filtered %d of %d prompts longer than max_prompt_length=%d",
                self.num_filtered,
                total,
                self.max_prompt_length,
            )
        if self.num_truncated:
            logger.warning(
                "truncated (%s) %d of %d prompts to max_prompt_length=%d",
                self.truncation,
                self.num_truncated,
                total,
                self.max_prompt_length,
            )

    @staticmethod
    def _check_tokenizer(tokenizer: Any) -> int:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {name!r} has no chat template, so chat prompts cannot be rendered; use the tokenizer "
                "of an instruct/chat model (e.g. HuggingFaceTB/SmolLM2-135M-Instruct) or set "
                "tokenizer.chat_template to a Jinja template before building the dataset"
            )
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            # verl's hf_tokenizer() does the same: pad with EOS when the model defines no pad token.
            pad = getattr(tokenizer, "eos_token_id", None)
        if pad is None:
            raise ValueError(f"tokenizer {name!r} has neither pad_token_id nor eos_token_id; set tokenizer.pad_token")
        return int(pad)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        tokens = self._ids[idx]
        pad = self.max_prompt_length - len(tokens)
        input_ids = torch.tensor([self.pad_token_id] * pad + tokens, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(tokens), dtype=torch.long)
        item = dict(self._rows[idx])
        item["input_ids"] = input_ids
        item["attention_mask"] = attention_mask
        item["position_ids"] = compute_position_ids(attention_mask)
        return item


def _refuse_images(rows: list[tuple[dict, str, int]], image_key: str) -> None:
    """verl's multimodal rows carry images in ``data.image_key``; dropping them would train on the text alone."""
    for row, file, i in rows:
        value = row.get(image_key)
        if value is not None and (not hasattr(value, "__len__") or len(value) > 0):
            raise ValueError(
                f"{file} row {i}: column {image_key!r} (data.image_key) holds images, but vision-language prompts "
                "are not supported yet; use a text-only dataset (or point data.image_key at no column)"
            )


def _object_array(values: list[Any]) -> np.ndarray:
    # np.array(list_of_lists) would build a 2-D array; fill an object vector element by element instead.
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def collate_to_dicts(items: Sequence[dict[str, Any]]) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Stack dataset items: tensors -> ``(bs, ...)`` tensors, everything else -> numpy object arrays ``(bs,)``.

    Raises ``KeyError`` when an item lacks a key the first item has.
    """
    if not items:
        raise ValueError("cannot collate an empty batch")
    keys = list(items[0])
    for j, item in enumerate(items):
        missing = [k for k in keys if k not in item]
        if missing:
            raise KeyError(f"batch item {j} lacks key(s) {missing} present in item 0")
    tensors = {k: torch.stack([it[k] for it in items]) for k in keys if isinstance(items[0][k], torch.Tensor)}
    non_tensors = {k: _object_array([it[k] for it in items]) for k in keys if k not in tensors}
    return tensors, non_tensors


def collate_fn(items: Sequence[dict[str, Any]]) -> Any:
    """Collate dataset items into a :class:`verl.protocol.DataProto` (verl's ``rl_dataset.collate_fn``).

    ``batch`` holds ``input_ids``, ``attention_mask``, ``position_ids`` ``(bs, max_prompt_length)`` int64;
    ``non_tensor_batch`` holds the other keys as numpy object arrays of shape ``(bs,)``.
    """
    from verl.protocol import DataProto

    tensors, non_tensors = collate_to_dicts(items)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
