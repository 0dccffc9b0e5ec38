"""The tool interface of the agent loops (verl ``verl/tools/base_tool.py``).

A tool is one object shared by every sample of a run (and by the agent manager's event-loop threads); per-sample
state lives under the *instance id* :meth:`BaseTool.create` returns, from the first call of a sample until
:meth:`BaseTool.release` at its end. The agent loop (:mod:`verl.agents.tool_agent`) calls, per sample and tool:

1. ``create(None, **create_kwargs)`` once, before the first call (``create_kwargs`` = the row's
   ``tools_kwargs[name]["create_kwargs"]``, e.g. the ground truth);
2. ``execute(instance_id, arguments)`` per call (arguments already checked against the schema), each under
   ``asyncio.wait_for(..., tool.timeout_s)``; its ``(response, step_reward, metrics)`` go to the conversation,
   ``tool_rewards`` and the sample's metrics (``metrics["timed_out"]`` is counted as a tool timeout);
3. ``calc_reward(instance_id)`` at the end (``tool_final_rewards``), then ``release(instance_id)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from uuid import uuid4

from verl.tools.schemas import ToolResponse, ToolSchema

__all__ = ["BaseTool"]


class BaseTool:
    """Base class of tools; subclasses implement :meth:`execute` and, where they keep state, the others.

    Args:
        config: the YAML entry's ``config`` mapping (verl's ``type: native`` key may be in it). ``timeout``
            (seconds, default 30) becomes :attr:`timeout_s`.
        tool_schema: a :class:`ToolSchema`, its dict form, or None for the class's :attr:`default_tool_schema`.

    Attributes:
        config: a copy of ``config``.
        tool_schema: the :class:`ToolSchema` (the agent loop checks arguments with its ``check_arguments``).
        timeout_s: the agent loop's limit on one ``create`` / ``execute`` call, in seconds.

    Raises:
        TypeError: ``config`` is not a mapping, or ``tool_schema`` is of another type.
        ValueError: a bad schema dict, no schema at all, or ``timeout`` not a positive number.
    """

    #: The schema dict used when the YAML entry has no ``tool_schema`` (verl: the subclass's own schema).
    default_tool_schema: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, config: Mapping[str, Any] | None, tool_schema: ToolSchema | Mapping[str, Any] | None) -> None:
        owner = type(self).__name__
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise TypeError(
                f"{owner}: config must be a mapping (the YAML entry's config:), got {type(config).__name__}"
            )
        self.config = dict(config)
        if tool_schema is None:
            tool_schema = self.default_tool_schema
            if tool_schema is None:
                raise ValueError(
                    f"{owner}: no tool_schema: give one in the tool's YAML entry (tool_schema: {{type: function, "
                    "function: {...}}) or set the class's default_tool_schema"
                )
        if isinstance(tool_schema, Mapping):
            tool_schema = ToolSchema.from_dict(tool_schema, where=f"{owner} tool_schema")
        if not isinstance(tool_schema, ToolSchema):
            raise TypeError(f"{owner}: tool_schema must be a ToolSchema or its dict, got {type(tool_schema).__name__}")
        self.tool_schema = tool_schema
        self.timeout_s = _positive(self.config.get("timeout", 30), f"{owner} config.timeout")

    @property
    def name(self) -> str:
        """The function name the model calls (``tool_schema.name``)."""
        return self.tool_schema.name

    def get_openai_tool_schema(self) -> dict[str, Any]:
        """The OpenAI schema dict for the chat template (:meth:`ToolSchema.to_dict`)."""
        return self.tool_schema.to_dict()

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start a sample's instance; returns ``(instance_id, creation response)`` (a new uuid4 when None)."""
        return (str(uuid4()) if instance_id is None else instance_id), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call with the model's ``parameters``; returns ``(response, step reward, metrics)``.

        Raises:
            NotImplementedError: always, here; every tool defines what it does.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement execute(instance_id, parameters)")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's final reward (``tool_final_rewards``); 0.0 unless a tool scores (verl)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance's state; nothing to drop here."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, timeout_s={self.timeout_s:g})"


def _positive(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{field}={value!r} must be a positive number of seconds")
    return float(value)
