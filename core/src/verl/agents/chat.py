"""Token ids of a conversation built turn by turn, as the chat template would render the whole of it.

An agent loop keeps one growing list of token ids: the prompt, the model's own tokens of each turn (exactly as
sampled, never re-tokenized: the trainer must score what the model produced) and, between them, the tokens of
the messages the environment adds (tool responses, interaction turns). Those are rendered with the tokenizer's
chat template: :func:`message_ids` returns the ids the template puts after the model's turn for a list of new
messages, ending with the next generation prompt. The template is rendered as text and tokenized without
special tokens added, as the dataset tokenizes prompts (:mod:`verl.data.prompt_tokens`).

Why a delta against a fixed conversation rather than re-rendering the sample's own messages: the model's
tokens may not survive a decode/encode round trip, and a template may rewrite earlier turns (e.g. drop
reasoning). Rendering ``[system, user, assistant] + new`` and cutting the fixed part off gives the new
messages' tokens alone, whatever came before (verl's ToolAgentLoop does the same with a dummy system
message). :func:`template_mismatch` is verl's ``tokenization_sanity_check_mode``: it compares the ids built this
way with the template rendering the whole conversation, for a metric.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_BASE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
]


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool, **kwargs: Any) -> str:
    """The chat template's text for ``messages`` (``kwargs``: ``tools=`` schemas, ``apply_chat_template_kwargs``)."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text`` tokenized without added special tokens (template text already carries them)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of the first model turn's prompt: ``messages`` (+ ``tools`` schemas) and the generation prompt.

    A template that does not use ``tools`` renders the same text with or without them (SmolLM2's): the tools
    must then be described in the system prompt (``verl data gsm8k --tools`` does).
    """
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
    return encode(tokenizer, render(tokenizer, messages, add_generation_prompt=True, **kwargs))


def turn_end_text(tokenizer: Any, eos_text: str) -> tuple[str, str]:
    """What the template writes after an assistant message's content: ``(end_of_turn, after_eos)``.

    ``end_of_turn`` is the whole text after the content (``"<|im_end|>\\n"`` for ChatML); ``after_eos`` is the part
    after ``eos_text`` within it (``"\\n"``), for a model turn that already ended with its EOS token.
    """
    text = render(tokenizer, _BASE, add_generation_prompt=False)
    end = text[text.rindex("A") + 1 :]
    cut = end.find(eos_text) if eos_text else -1
    return end, (end[cut + len(eos_text) :] if cut >= 0 else end)


def message_ids(
    tokenizer: Any,
    new_messages: Sequence[Mapping[str, Any]],
    *,
    ended_with_eos: bool,
    eos_text: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids to append after a model turn for ``new_messages`` (tool / user turns), then the next
    generation prompt.

    Args:
        new_messages: the messages the environment adds, e.g. ``[{"role": "tool", "content": "42"}]``.
        ended_with_eos: the model's turn ended with its EOS token (else the template's end of turn is added
            whole, EOS included, so the next turn starts where the template would start it).
        eos_text: the EOS token's text (``tokenizer.eos_token``).

    Raises:
        ValueError: the template renders the fixed conversation differently once messages are added (it
            rewrites earlier turns), so no delta exists; the message names the template's behaviour.
    """
    kwargs = dict(template_kwargs or {})
    base = render(tokenizer, _BASE, add_generation_prompt=False, **kwargs)
    full = render(tokenizer, [*_BASE, *new_messages], add_generation_prompt=True, **kwargs)
    if not full.startswith(base):
        raise ValueError(
            "the chat template renders earlier turns differently once a message is added, so the tokens of a "
            "tool / user turn cannot be appended to the conversation; use a template that keeps earlier turns"
        )
    end, after_eos = turn_end_text(tokenizer, eos_text)
    prefix = after_eos if ended_with_eos else end
    return encode(tokenizer, prefix + full[len(base) :])


def template_mismatch(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    ids: Sequence[int],
    *,
    mode: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> bool:
    """verl's ``tokenization_sanity_check_mode``: do ``ids`` (built turn by turn) differ from the template's
    rendering of the whole ``messages``? ``strict`` compares decoded text exactly, ``ignore_strippable`` ignores
    leading / trailing whitespace, ``disable`` never reports. The conversation must end on a model turn."""
    if mode == "disable":
        return False
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
    want = render(tokenizer, messages, add_generation_prompt=False, **kwargs)
    got = tokenizer.decode(list(ids), skip_special_tokens=False)
    if mode == "ignore_strippable":
        return want.strip() != got.strip() and not want.strip().startswith(got.strip())
    return want != got and not want.startswith(got)


__all__ = ["encode", "message_ids", "prompt_ids", "render", "template_mismatch", "turn_end_text"]
