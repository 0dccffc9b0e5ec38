"""The interaction interface (verl 0.5 ``verl/interactions/base.py``).

One interaction object serves every sample of a run (and every event-loop thread of the agent manager); per-sample
state lives under the instance id :meth:`BaseInteraction.start_interaction` returns. The agent loop
(:mod:`verl.agents.tool_agent`) calls, for a row whose ``interaction_kwargs.name`` names this interaction:

1. ``start_interaction(request_id, **interaction_kwargs)`` before the first model turn;
2. after each model turn without tool calls, ``generate_response(instance_id, messages, **interaction_kwargs)``
   with the whole conversation so far; its ``(should_terminate, text, turn_score, extra)`` ends the sample or
   adds ``text`` as the next user turn, and ``turn_score`` goes to ``turn_scores``;
3. ``finalize_interaction(instance_id)`` at the end, also when the sample failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import uuid4

__all__ = ["BaseInteraction"]


class BaseInteraction:
    """Base class of interactions; subclasses implement :meth:`generate_response` and keep their own state.

    Args:
        config: the YAML entry's ``config`` mapping; :func:`~verl.interactions.config.load_interactions` puts the
            entry's ``name`` in it.

    Attributes:
        config: a copy of ``config``.
        name: ``config["name"]`` (verl's default ``"interaction_agent"`` when absent), what rows name in
            ``interaction_kwargs.name``.

    Raises:
        TypeError: ``config`` is not a mapping, or its ``name`` is not a non-empty string.
    """

    def __init__(self, config: Mapping[str, Any] | None) -> None:
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise TypeError(f"{type(self).__name__}: config must be a mapping, got {type(config).__name__}")
        self.config = dict(config)
        name = self.config.get("name", "interaction_agent")
        if not isinstance(name, str) or not name:
            raise TypeError(f"{type(self).__name__}: config name must be a non-empty string, got {name!r}")
        self.name: str = name

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start a sample's instance; returns its id (a new uuid4 when None)."""
        return str(uuid4()) if instance_id is None else instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """The user's reply to the conversation ``messages`` (``[{"role", "content"}, ...]``, the model's turn
        last): ``(should_terminate, response text, turn score, extra data)``.

        Raises:
            NotImplementedError: always, here; every interaction defines its replies.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement generate_response(instance_id, messages)")

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's score so far; 0.0 unless an interaction scores (verl)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance's state; nothing to drop here."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
