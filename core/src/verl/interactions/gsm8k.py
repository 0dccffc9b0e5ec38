"""``gsm8k``: tells the model whether its last answer is right (verl 0.5 ``verl/interactions/gsm8k_interaction.py``).

Each :meth:`~Gsm8kInteraction.generate_response` scores the latest assistant message with core's GSM8K scorer
(:func:`verl.rewards.gsm8k.compute_score`, ``method="strict"``: the number after ``"####"``, ``format_score=0.0``,
``score=1.0``). A score of 1.0 replies ``"Your response is correct!"`` and ends the conversation; anything else
replies ``"Your response is incorrect! You need to reflect on your answer and try again."`` and goes on. The turn
score is that score.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.interactions.base import BaseInteraction
from verl.rewards import gsm8k

__all__ = ["CORRECT", "INCORRECT", "Gsm8kInteraction"]

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    """verl's GSM8K interaction (module docstring); ``config`` needs nothing but the ``name``."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        # instance id -> {"response": last assistant text, "ground_truth": reference, "reward": last score}
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: str | int | float | None = None, **kwargs: Any
    ) -> str:
        """Start an instance for ``ground_truth`` (the row's ``interaction_kwargs.ground_truth``).

        Raises:
            ValueError: no ground truth, so no answer could ever be right.
        """
        if ground_truth is None:
            raise ValueError(
                f"interaction {self.name!r}: start_interaction needs ground_truth; set the row's "
                "interaction_kwargs.ground_truth (verl data gsm8k --tools writes it)"
            )
        instance_id = str(uuid4()) if instance_id is None else instance_id
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    def _state(self, instance_id: str) -> dict[str, Any]:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise KeyError(
                f"interaction {self.name!r}: unknown instance {instance_id!r}; call start_interaction first"
            ) from None

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """Score the last assistant message; ``(True, CORRECT, 1.0, {})`` or ``(False, INCORRECT, score, {})``.

        Raises:
            KeyError: ``instance_id`` was not started (or was finalized).
        """
        state = self._state(instance_id)
        content = ""
        for message in reversed(messages):
            if message.get("role") == "assistant":
                content = message.get("content") or ""
                break
        state["response"] = content if isinstance(content, str) else str(content)
        reward = await self.calculate_score(instance_id)
        state["reward"] = reward
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, INCORRECT, reward, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """The last assistant message's strict GSM8K score against the ground truth."""
        state = self._state(instance_id)
        return gsm8k.compute_score(
            state["response"], state["ground_truth"], method="strict", format_score=0.0, score=1.0
        )

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance (a second call is a no-op)."""
        self._instances.pop(instance_id, None)
