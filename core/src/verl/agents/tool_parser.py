"""Tool-call parsers: find the calls in a model turn's text (verl ``verl/experimental/agent_loop/tool_parser.py``).

A parser is chosen by name (``actor_rollout_ref.rollout.multi_turn.format``, default ``hermes``) from the registry
:meth:`ToolParser.register` fills. :meth:`ToolParser.extract_tool_calls` returns a :class:`ParsedTurn`: the text
without the call blocks, the well-formed calls, and one message per malformed block. Unlike verl, which logs a
malformed call and drops it, the message goes back to the model as a tool response (and is counted as
``tool/parse_errors``), so the model learns what it got wrong. Parsers work on decoded text, so the agent loop
decodes once; a plugin adds a format with ``@ToolParser.register("name")``.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import attrs

__all__ = ["FunctionCall", "HermesToolParser", "ParsedTurn", "ToolParser"]

_JSON_NAMES = {str: "string", list: "array", int: "number", float: "number", bool: "boolean", type(None): "null"}


@attrs.frozen
class FunctionCall:
    """One parsed call (verl's ``FunctionCall``).

    Attributes:
        name: the function name.
        arguments: the arguments object as JSON text (``json.dumps(..., ensure_ascii=False)``); the agent loop
            parses it and checks it against the tool's schema.
    """

    name: str
    arguments: str


@attrs.frozen
class ParsedTurn:
    """A model turn split into prose and calls.

    Attributes:
        content: the text with every tool-call block removed.
        calls: the well-formed calls, in order.
        errors: one human-readable message per malformed block (bad JSON, no ``name``, ``arguments`` not an
            object, an unclosed block), in order.
    """

    content: str
    calls: list[FunctionCall] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)


class ToolParser(ABC):
    """Base of the parsers and their registry.

    Args:
        tokenizer: the model's tokenizer (a parser may need it for its stop tokens).
    """

    _registry: ClassVar[dict[str, type[ToolParser]]] = {}

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end a generation so the parser can run (verl: none by default; the model's EOS follows a
        call in the hermes format)."""
        return []

    @abstractmethod
    def extract_tool_calls(self, text: str) -> ParsedTurn:
        """Split one decoded model turn into content, calls and errors (see :class:`ParsedTurn`)."""

    @classmethod
    def register(cls, name: str) -> Any:
        """Class decorator registering a parser under ``name``.

        Raises:
            ValueError: ``name`` is empty or already registered by another class.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"ToolParser.register: name must be a non-empty string, got {name!r}")

        def decorator(subclass: type[ToolParser]) -> type[ToolParser]:
            if not (isinstance(subclass, type) and issubclass(subclass, ToolParser)):
                raise TypeError(f"ToolParser.register({name!r}): {subclass!r} is not a ToolParser subclass")
            existing = cls._registry.get(name)
            if existing is not None and existing is not subclass:
                raise ValueError(
                    f"tool parser {name!r} is already registered by {existing.__module__}.{existing.__qualname__}; "
                    "choose another name"
                )
            cls._registry[name] = subclass
            return subclass

        return decorator

    @classmethod
    def get(cls, name: str, tokenizer: Any) -> ToolParser:
        """The parser registered as ``name``, built for ``tokenizer``.

        Raises:
            ValueError: no parser of that name, listing the registered ones (``multi_turn.format``).
        """
        if name not in cls._registry:
            raise ValueError(
                f"unknown tool parser {name!r} (actor_rollout_ref.rollout.multi_turn.format); registered: {cls.names()}"
            )
        return cls._registry[name](tokenizer)

    @classmethod
    def names(cls) -> list[str]:
        """The registered parser names, sorted."""
        return sorted(cls._registry)


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes / Qwen; verl's and vLLM's).

    Each block's body must be a JSON object with a non-empty string ``name`` and an object ``arguments``
    (a missing ``arguments`` means none: ``{}``). A ``<tool_call>`` without its ``</tool_call>`` is an error too
    (typically a turn cut by the length limit), and its text is dropped from ``content``.
    """

    start_tag = "<tool_call>"
    end_tag = "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def extract_tool_calls(self, text: str) -> ParsedTurn:
        calls: list[FunctionCall] = []
        errors: list[str] = []
        for index, match in enumerate(self._block.finditer(text), start=1):
            call, error = self._parse_block(match.group(1), index)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
        content = self._block.sub("", text)
        unclosed = content.find(self.start_tag)
        if unclosed >= 0:
            errors.append(f"a {self.start_tag} block was not closed with {self.end_tag}")
            content = content[:unclosed]
        return ParsedTurn(content=content, calls=calls, errors=errors)

    def _parse_block(self, body: str, index: int) -> tuple[FunctionCall | None, str]:
        # Short messages: they come back to the model as tool responses, inside its response-length budget, and
        # the model has its own call in context, so the block is named by position rather than quoted.
        where = f"tool call {index}"
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            at = f"line {exc.lineno} column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
            return None, f"{where}: invalid JSON ({exc.msg} at {at})"
        if not isinstance(data, dict):
            return None, f'{where} must be a JSON object {{"name": ..., "arguments": {{...}}}}'
        name = data.get("name")
        if not isinstance(name, str) or not name.strip():
            return None, f'{where} has no "name" (the function to call, a string)'
        arguments = data.get("arguments", {})
        if not isinstance(arguments, dict):
            kind = _JSON_NAMES.get(type(arguments), type(arguments).__name__)
            return None, f'{where}: "arguments" must be a JSON object, got {kind}'
        return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)), ""
