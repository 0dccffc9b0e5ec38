"""A tool's OpenAI function schema and its response (verl ``verl/tools/schemas.py``).

:class:`ToolSchema` is verl's ``OpenAIFunctionToolSchema``, read from the dict form tool YAML files carry::

    {"type": "function", "function": {"name": ..., "description": ...,
        "parameters": {"type": "object", "properties": {arg: {"type": ..., ...}}, "required": [...]}}}

:meth:`ToolSchema.to_dict` gives that dict back for ``tokenizer.apply_chat_template(tools=[...])``, and
:meth:`ToolSchema.check_arguments` tells the agent loop what is wrong with a model's arguments, so the model gets
a tool response it can act on instead of a tool crashing on a missing key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["JSON_TYPES", "ToolResponse", "ToolSchema"]

#: JSON Schema type name -> what ``json.loads`` makes of it (bool is not a number here, as in JSON).
JSON_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")


def _is_type(value: Any, json_type: str) -> bool:
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "boolean":
        return isinstance(value, bool)
    if json_type == "integer":
        # JSON Schema: 2.0 is an integer (draft 6+); True is not.
        return not isinstance(value, bool) and (
            isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        )
    if json_type == "number":
        return not isinstance(value, bool) and isinstance(value, (int, float))
    if json_type == "array":
        return isinstance(value, list)
    if json_type == "object":
        return isinstance(value, dict)
    return value is None  # "null"


def _json_type_name(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _is_type(value, name):
            return name
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@attrs.define
class ToolResponse:
    """What a tool hands back to the conversation (verl's ``ToolResponse``).

    Attributes:
        text: the tool message's text, or None.
        image: a list of images (processor inputs) or None; a single image must be wrapped in a list (verl).
        video: a list of videos or None.

    Raises:
        TypeError: ``image`` / ``video`` is neither None nor a list.
    """

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    def __attrs_post_init__(self) -> None:
        for field in ("image", "video"):
            value = getattr(self, field)
            if value is not None and not isinstance(value, list):
                raise TypeError(
                    f"ToolResponse.{field} must be a list or None, got {type(value).__name__}; wrap a single "
                    f"{field} in a list: {field}=[x]"
                )

    def is_empty(self) -> bool:
        """No text, image or video."""
        return not self.text and not self.image and not self.video


@attrs.frozen
class ToolSchema:
    """An OpenAI function tool schema (verl's ``OpenAIFunctionToolSchema``); build it with :meth:`from_dict`.

    Attributes:
        name: the function name the model calls.
        description: what the tool does (shown to the model by the chat template).
        parameters: the JSON Schema object of the arguments (``type``, ``properties``, ``required``).
        strict: OpenAI's ``strict`` flag (kept only for :meth:`to_dict`).
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = attrs.field(factory=lambda: {"type": "object", "properties": {}, "required": []})
    strict: bool = False

    @classmethod
    def from_dict(cls, data: Any, *, where: str) -> ToolSchema:
        """Validate verl's schema dict (shape in the module docstring) and build the schema.

        Args:
            data: the ``tool_schema`` mapping of a tool YAML entry (or of code).
            where: names the source in errors, e.g. ``"tools.yaml: tools[0].tool_schema"``.

        Raises:
            ValueError: ``where`` + the missing or ill-typed field and what to write instead: ``type`` not
                ``"function"``, no ``function`` mapping, an empty ``function.name``, a ``description`` that is
                not a string, ``parameters.type`` not ``"object"``, a property without a known JSON ``type``, a
                ``required`` name that is not a property.
        """

        def fail(field: str, problem: str) -> ValueError:
            return ValueError(f"{where}: {field} {problem}")

        if not isinstance(data, Mapping):
            raise fail("tool_schema", f"must be a mapping {{type: function, function: {{...}}}}, got {_short(data)}")
        if data.get("type") != "function":
            raise fail("type", f"must be 'function' (OpenAI function tools), got {_short(data.get('type'))}")
        function = data.get("function")
        if not isinstance(function, Mapping):
            raise fail("function", "is missing: give function: {name, description, parameters}")
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise fail("function.name", f"must be a non-empty string, got {_short(name)}")
        description = function.get("description")
        if not isinstance(description, str):
            raise fail(
                "function.description",
                f"is missing or not a string (got {_short(description)}): describe what the tool does, the model "
                "reads it",
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}, "required": []})
        _check_parameters(parameters, fail)
        strict = function.get("strict", False)
        if not isinstance(strict, bool):
            raise fail("function.strict", f"must be true or false, got {_short(strict)}")
        params = copy.deepcopy(dict(parameters))
        params.setdefault("properties", {})
        params.setdefault("required", [])
        return cls(name=name, description=description, parameters=params, strict=strict)

    @property
    def properties(self) -> Mapping[str, Mapping[str, Any]]:
        """``{argument: its JSON Schema}``."""
        return self.parameters.get("properties", {})

    @property
    def required(self) -> list[str]:
        """The arguments the model must give."""
        return list(self.parameters.get("required", []))

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI dict (a deep copy), for ``apply_chat_template(tools=[...])``; ``strict`` only when true."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": copy.deepcopy(dict(self.parameters)),
        }
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}

    def check_arguments(self, args: Any) -> str | None:
        """What is wrong with a model's call arguments, as one sentence for the model, or None if nothing is.

        Checks (JSON Schema's, at the top level only): ``args`` is an object; every ``required`` argument is
        given; no argument outside ``properties``; each value has its property's JSON ``type`` (``string``,
        ``number``, ``integer``, ``boolean``, ``array``, ``object``, ``null`` or a list of them; ``true`` is not
        a number, ``2.0`` is an integer) and, where the property has an ``enum``, is one of it. Every problem
        found is listed, separated by ``"; "``.
        """
        if not isinstance(args, dict):
            return f"the arguments must be a JSON object, got {_json_type_name(args)}"
        problems = []
        missing = [name for name in self.required if name not in args]
        if missing:
            problems.append("missing required argument(s) " + ", ".join(repr(m) for m in missing))
        unknown = [name for name in args if name not in self.properties]
        if unknown:
            expected = ", ".join(repr(p) for p in self.properties) or "none"
            problems.append(f"unknown argument(s) {', '.join(repr(u) for u in unknown)} (expected: {expected})")
        for name, value in args.items():
            spec = self.properties.get(name)
            if spec is None:
                continue
            types = spec.get("type")
            types = [types] if isinstance(types, str) else list(types or [])
            if types and not any(_is_type(value, t) for t in types):
                problems.append(
                    f"argument {name!r} must be {' or '.join(types)}, got {_json_type_name(value)} {_short(value)}"
                )
            elif "enum" in spec and value not in spec["enum"]:
                problems.append(f"argument {name!r} must be one of {spec['enum']}, got {_short(value)}")
        return "; ".join(problems) or None


def _check_parameters(parameters: Any, fail: Any) -> None:
    if not isinstance(parameters, Mapping):
        raise fail(
            "function.parameters", f"must be a mapping {{type: object, properties: {{...}}}}, got {_short(parameters)}"
        )
    if parameters.get("type") != "object":
        raise fail("function.parameters.type", f"must be 'object', got {_short(parameters.get('type'))}")
    properties = parameters.get("properties", {})
    if not isinstance(properties, Mapping):
        raise fail("function.parameters.properties", f"must be a mapping of argument schemas, got {_short(properties)}")
    for arg, spec in properties.items():
        field = f"function.parameters.properties.{arg}"
        if not isinstance(spec, Mapping):
            raise fail(field, f"must be a mapping with a 'type', got {_short(spec)}")
        types = spec.get("type")
        listed = [types] if isinstance(types, str) else types
        if not isinstance(listed, list) or not listed or not all(t in JSON_TYPES for t in listed):
            raise fail(f"{field}.type", f"must be one of {list(JSON_TYPES)} or a list of them, got {_short(types)}")
        if "enum" in spec and not isinstance(spec["enum"], list):
            raise fail(f"{field}.enum", f"must be a list of allowed values, got {_short(spec['enum'])}")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise fail("function.parameters.required", f"must be a list of argument names, got {_short(required)}")
    undeclared = [r for r in required if r not in properties]
    if undeclared:
        raise fail(
            "function.parameters.required",
            f"names {undeclared}, which are not in properties ({list(properties)}): declare them or drop them",
        )
