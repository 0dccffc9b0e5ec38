"""``calc_gsm8k_reward``: the model submits an answer and hears its score (verl's removed
``verl/tools/gsm8k_tool.py``, last version ``5a506cc58^``).

Per sample: :meth:`Gsm8kTool.create` stores the row's ground truth; each :meth:`~Gsm8kTool.execute` takes
``{"answer": ...}``, prefixes ``"#### "`` unless the answer starts with it, scores it with core's GSM8K scorer
(:func:`verl.rewards.gsm8k.compute_score`, ``method="flexible"``, ``format_score=0.0``, ``score=1.0``: so any
number read from the answer counts) and replies ``Current parsed answer='…' reward=…``. The step reward is 0.0
when the score is higher than the previous submission's (0.0 before the first) and -0.05 otherwise (verl: a
penalty for resubmitting without improving; verl compares with the *previous* score, not the best, so 1, 0, 1
gives 0.0, -0.05, 0.0); :meth:`~Gsm8kTool.calc_reward` is the latest submission's score. Core's scorer compares numbers (``"72.0"`` equals
``"72"``), where verl's compares strings; see :mod:`verl.rewards.gsm8k`.
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import uuid4

from verl.rewards import gsm8k
from verl.tools import default_schemas
from verl.tools.base import BaseTool
from verl.tools.schemas import ToolResponse

__all__ = ["Gsm8kTool", "NO_IMPROVEMENT_PENALTY"]

#: verl's step reward for a submission that does not beat the best score so far.
NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    """verl's GSM8K reward tool (module docstring). ``config`` has no keys of its own (``timeout`` as BaseTool)."""

    default_tool_schema: ClassVar[dict[str, Any]] = default_schemas.CALC_GSM8K_REWARD

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        super().__init__(config, tool_schema)
        # instance id -> {"response": last submission, "ground_truth": reference, "reward": its score}
        self._instances: dict[str, dict[str, Any]] = {}

    async def create(
        self, instance_id: str | None = None, ground_truth: str | int | float | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """Start an instance holding ``ground_truth`` (verl also reads ``create_kwargs={"ground_truth": ...}``).

        Raises:
            ValueError: no ground truth: the row's ``tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``
                is missing, and every answer would score 0.
        """
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        if ground_truth is None:
            raise ValueError(
                f"{self.name}: create() needs ground_truth; set the row's tools_kwargs.{self.name}.create_kwargs."
                "ground_truth (verl data gsm8k --tools calc_gsm8k_reward writes it)"
            )
        instance_id = str(uuid4()) if instance_id is None else instance_id
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    def _state(self, instance_id: str) -> dict[str, Any]:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise KeyError(f"{self.name}: unknown instance {instance_id!r}; call create() first") from None

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Score ``parameters["answer"]``; returns ``(reply, 0.0 or -0.05, {})`` (module docstring).

        Raises:
            KeyError: ``instance_id`` was not created (or was released).
        """
        state = self._state(instance_id)
        answer = parameters.get("answer", "")
        if not isinstance(answer, str):
            answer = str(answer)
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The last submission's score: 1.0 if its number equals the ground truth, else 0.0."""
        state = self._state(instance_id)
        return gsm8k.compute_score(
            state["response"], state["ground_truth"], method="flexible", format_score=0.0, score=1.0
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the instance (a second release is a no-op)."""
        self._instances.pop(instance_id, None)
