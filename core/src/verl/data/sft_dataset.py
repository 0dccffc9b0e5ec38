"""SFT rows -> token ids and a loss mask on the assistant tokens (verl ``MultiTurnSFTDataset`` semantics).

A conversation is tokenised as the chat template renders it whole. Turn ``i``'s tokens are those the
rendering of ``messages[:i+1]`` adds to the rendering of ``messages[:i]``; for an assistant turn the tokens the
generation prompt adds (``<|im_start|>assistant\\n`` for ChatML) are context, and everything after them is
loss: the content, the end-of-turn token and what the template writes after it (``<|im_end|>\\n`` for ChatML),
exactly verl's mask (``loss_mask[: len(generation_prompt)] = 0`` on each assistant turn). A template that does
not render conversations as growing prefixes (e.g. one that rewrites earlier turns) is refused naming the row.

Single-turn rows (``prompt_key`` + ``response_key``) are the two-message conversation ``[user: prompt,
assistant: response]`` (a prompt already given as a message list is used as is), so the loss is on the
response plus the end-of-turn tokens.

Rows longer than ``max_length`` follow ``truncation``: ``error`` (names the row, its length and max_length),
``left`` (keep the last ``max_length`` tokens) or ``right`` (keep the first), as verl's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from verl.data.rows import read_rows


class SFTRowError(ValueError):
    """A row cannot become a training example (bad messages, too long with ``truncation=error``, ...)."""


def _render_ids(tokenizer: Any, messages: list[dict], *, gen: bool, kwargs: Mapping[str, Any]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_conversation(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], template_kwargs: Mapping[str, Any] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and its loss mask (1 on assistant tokens, see the module docstring).

    Args:
        tokenizer: HF tokenizer with a chat template.
        messages: ``[{"role", "content"}, ...]``.
        template_kwargs: extra ``apply_chat_template`` kwargs.

    Returns:
        ``(input_ids, loss_mask)``, two int lists of equal length.

    Raises:
        SFTRowError: no assistant turn, a message without role/content, or a template whose renderings of the
            growing conversation are not prefixes of each other.
    """
    kwargs = dict(template_kwargs or {})
    msgs = [dict(m) for m in messages]
    for i, m in enumerate(msgs):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise SFTRowError(f"message {i} needs a string 'role' and 'content', got {sorted(m)}")
    if not any(m["role"] == "assistant" for m in msgs):
        raise SFTRowError("the conversation has no assistant turn: nothing to train on")
    if msgs[0]["role"] == "assistant":
        # No context to render a generation prompt from: the template's header would count as loss.
        raise SFTRowError("the conversation starts with an assistant turn; put a system or user turn first")
    ids: list[int] = []
    mask: list[int] = []
    for i, m in enumerate(msgs):
        full = _render_ids(tokenizer, msgs[: i + 1], gen=False, kwargs=kwargs)
        if m["role"] == "assistant":
            context = _render_ids(tokenizer, msgs[:i], gen=True, kwargs=kwargs)
        else:
            context = ids
        if full[: len(ids)] != ids or full[: len(context)] != context or len(context) < len(ids):
            raise SFTRowError(
                f"turn {i} ({m['role']}): the chat template does not render the conversation as growing prefixes "
                "(an earlier turn's tokens change when a turn is added), so turn boundaries are ambiguous"
            )
        if m["role"] == "assistant":
            mask += [0] * (len(context) - len(ids)) + [1] * (len(full) - len(context))
        else:
            mask += [0] * (len(full) - len(ids))
        ids = full
    return ids, mask


def truncate_example(
    ids: list[int], mask: list[int], max_length: int, mode: str, *, where: str
) -> tuple[list[int], list[int]]:
    """Cut a row to ``max_length`` tokens by ``mode`` (``error``/``left``/``right``, verl's).

    Raises:
        SFTRowError: ``mode="error"`` and the row is longer (names ``where``, the length and the fix).
        ValueError: unknown ``mode``.
    """
    if len(ids) <= max_length:
        return ids, mask
    if mode == "error":
        raise SFTRowError(
            f"{where}: {len(ids)} tokens, longer than data.max_length={max_length}; raise data.max_length or "
            "set data.truncation=left|right"
        )
    if mode == "left":
        return ids[-max_length:], mask[-max_length:]
    if mode == "right":
        return ids[:max_length], mask[:max_length]
    raise ValueError(f"data.truncation must be error|left|right, got {mode!r}")


class SFTDataset:
    """Tokenised SFT rows, built once from parquet/jsonl files.

    Args:
        data_files: file path(s) (parquet or jsonl), read with :func:`verl.data.rows.read_rows`.
        tokenizer: HF tokenizer with a chat template (its pad id pads the batches).
        config: the ``data`` section (:class:`verl.config.schema.sft.SFTDataConfig`).
        max_samples: keep the first N rows; -1 = all.

    ``dataset[i]`` is ``{"input_ids": list[int], "loss_mask": list[int]}``.

    Raises:
        SFTRowError: a bad row or a too long one with ``truncation=error``, naming ``file:row`` (0-based row).
    """

    def __init__(self, data_files: Any, tokenizer: Any, config: Any, max_samples: int = -1) -> None:
        self.tokenizer = tokenizer
        self.config = config
        rows = read_rows(data_files)
        if max_samples is not None and max_samples > 0:
            rows = rows[:max_samples]
        self.examples: list[dict[str, list[int]]] = []
        self.truncated = 0
        for row, file, index in rows:
            where = f"{file}:{index}"
            try:
                ids, mask = tokenize_conversation(tokenizer, self._messages(row), config.apply_chat_template_kwargs)
            except SFTRowError as exc:
                raise SFTRowError(f"{where}: {exc}") from None
            self.truncated += int(len(ids) > config.max_length)
            ids, mask = truncate_example(ids, mask, config.max_length, config.truncation, where=where)
            self.examples.append({"input_ids": ids, "loss_mask": mask})

    def _messages(self, row: Mapping[str, Any]) -> list[dict]:
        c = self.config
        if c.prompt_key is not None:
            for key in (c.prompt_key, c.response_key):
                if key not in row:
                    raise SFTRowError(f"column {key!r} missing; row has {sorted(row)}")
            prompt, response = row[c.prompt_key], row[c.response_key]
            if not isinstance(response, str):
                raise SFTRowError(f"data.response_key={c.response_key!r} must hold a string, got {type(response)}")
            head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else _as_messages(prompt)
            return [*head, {"role": "assistant", "content": response}]
        if c.messages_key not in row:
            raise SFTRowError(
                f"column data.messages_key={c.messages_key!r} missing; row has {sorted(row)} (single-turn rows: "
                "set data.prompt_key and data.response_key)"
            )
        return _as_messages(row[c.messages_key])

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, idx: int) -> dict[str, list[int]]:
        return self.examples[idx]


def _as_messages(value: Any) -> list[dict]:
    if hasattr(value, "tolist"):  # parquet list columns come back as numpy arrays
        value = value.tolist()
    if not isinstance(value, list | tuple) or not value:
        raise SFTRowError(f"messages must be a non-empty list of {{role, content}}, got {type(value).__name__}")
    return [dict(m) if isinstance(m, Mapping) else m for m in value]


def collate_sft(items: Sequence[Mapping[str, list[int]]], pad_id: int, *, pad_to: int | None = None) -> Any:
    """Right-pad rows into the training engines' layout (:mod:`verl.engines.base`).

    The whole row is the "response" after a one-token "prompt": ``prompts = input_ids[:, :1]``, ``responses =
    input_ids[:, 1:]``, so response log-prob ``t`` scores token ``t + 1`` and ``response_mask = loss_mask[:,
    1:]`` is verl's left-shifted loss mask (``torch.roll(loss_mask, -1)`` in ``sft_loss``).

    Args:
        items: ``{"input_ids", "loss_mask"}`` rows.
        pad_id: the tokenizer's pad id.
        pad_to: pad to this width (``pad_mode=right``: max_length); None = the longest row (``no_padding``).

    Returns:
        DataProto with ``input_ids, attention_mask, position_ids`` ``(bs, L)`` int64, ``prompts`` ``(bs, 1)``,
        ``responses, response_mask`` ``(bs, L - 1)``; ``meta_info["temperature"] = 1.0``.
    """
    from verl.data.dataset import compute_position_ids
    from verl.protocol import DataProto

    width = max(len(it["input_ids"]) for it in items)
    width = max(width, pad_to or 0, 2)
    bs = len(items)
    input_ids = torch.full((bs, width), int(pad_id), dtype=torch.long)
    attention = torch.zeros((bs, width), dtype=torch.long)
    loss_mask = torch.zeros((bs, width), dtype=torch.long)
    for r, it in enumerate(items):
        n = len(it["input_ids"])
        input_ids[r, :n] = torch.tensor(it["input_ids"], dtype=torch.long)
        attention[r, :n] = 1
        loss_mask[r, :n] = torch.tensor(it["loss_mask"], dtype=torch.long)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": compute_position_ids(attention),
        "prompts": input_ids[:, :1].clone(),
        "responses": input_ids[:, 1:].clone(),
        "response_mask": (loss_mask[:, 1:] * attention[:, 1:]).clone(),
    }
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})
