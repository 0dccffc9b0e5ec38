"""The agent-loop interface: what one sample's loop gets and what it returns (verl's ``AgentLoopBase``).

An agent loop runs one sample (one prompt repeat) as a coroutine: it sends the conversation's token ids to the
rollout server (:class:`AgentLoopContext.client`), appends what the model generated, and, for multi-turn loops,
the tokens of tool responses or user turns, until the conversation ends. It returns an :class:`AgentLoopOutput`;
the manager (:mod:`verl.agents.manager`) pads every sample into the trainer's batch layout.

Write one as a plugin (``docs/agents.md``): subclass :class:`AgentLoopBase`, implement :meth:`AgentLoopBase.run`,
return an ``AgentLoopSpec(name=..., factory=YourLoop)`` from a ``verl_agent_loops`` hook; rows whose
``agent_name`` column is that name run it. Source: verl ``verl/experimental/agent_loop/agent_loop.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.define(kw_only=True)
class AgentLoopOutput:
    """One sample's conversation as token ids (verl's ``AgentLoopOutput``).

    Attributes:
        prompt_ids: the first prompt's ids (chat template + generation prompt); left-padded into ``prompts``.
        response_ids: everything after it: the model's tokens of every turn and the tool / user turns between
            them, at most ``rollout.response_length`` ids; right-padded into ``responses``.
        response_mask: one int per response id: 1 on the model's own tokens (trained on, scored by the
            log-probs, KL and advantages), 0 on tool / interaction tokens (attended to, never trained on).
        response_logprobs: the sampler's log-prob of each response id (0.0 on mask-0 ids), or None when the
            rollout does not return log-probs.
        num_turns: turns of the conversation, verl's count: user turns + assistant turns + 1 (the prompt), so a
            single-turn sample has 2.
        metrics: per-sample numbers the trainer aggregates (``tool_calls``, ``tool_errors``,
            ``tool_parse_errors``, ``tool_timeouts``, ``tool_truncated``, ``generate_s``, ``tool_s`` seconds).
        extra_fields: per-sample values kept in the batch (verl: ``turn_scores``, ``tool_rewards``), passed to
            the reward function as ``extra_info["rollout_reward_scores"]``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 2
    metrics: dict[str, float] = attrs.field(factory=dict)
    extra_fields: dict[str, Any] = attrs.field(factory=dict)

    def check(self, *, response_length: int, owner: str) -> None:
        """Raise ValueError (naming ``owner``, the loop) when the lists disagree in length or overflow."""
        n = len(self.response_ids)
        if len(self.response_mask) != n:
            raise ValueError(f"{owner}: {len(self.response_mask)} response_mask entries for {n} response_ids")
        if self.response_logprobs is not None and len(self.response_logprobs) != n:
            raise ValueError(f"{owner}: {len(self.response_logprobs)} response_logprobs for {n} response_ids")
        if n > response_length:
            raise ValueError(f"{owner}: {n} response ids exceed rollout.response_length={response_length}")
        if any(m not in (0, 1) for m in self.response_mask):
            raise ValueError(f"{owner}: response_mask must hold only 0 and 1")
        if not self.prompt_ids:
            raise ValueError(f"{owner}: empty prompt_ids")


@attrs.define(kw_only=True)
class AgentLoopContext:
    """What every agent loop of one manager shares.

    Attributes:
        rollout_config: the ``actor_rollout_ref.rollout`` section (``multi_turn``, ``agent``, sampling keys).
        tokenizer: the HF tokenizer of the model.
        client: the load-balanced server client, ``await client.generate(request_id, prompt_ids,
            sampling_params) -> TokenOutput`` (:mod:`verl.engines.serving`).
        response_length: the response budget in tokens (every turn and tool response together).
        tools: ``{name: BaseTool}`` from ``multi_turn.tool_config_path`` (empty without).
        interactions: ``{name: BaseInteraction}`` from ``multi_turn.interaction_config_path`` (empty without).
        template_kwargs: ``data.apply_chat_template_kwargs``, passed to every chat-template rendering.
    """

    rollout_config: Any
    tokenizer: Any
    client: Any
    response_length: int
    tools: Mapping[str, Any] = attrs.field(factory=dict)
    interactions: Mapping[str, Any] = attrs.field(factory=dict)
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)


class AgentLoopBase:
    """Base class of agent loops; one instance runs one sample (verl's ``AgentLoopBase``).

    ``run(sampling_params, **sample)`` gets the sample's sampling params (``temperature``, ``top_p``, ``top_k``,
    ``logprobs``, ``seed``: :mod:`verl.engines.serving`; the loop sets ``max_tokens`` per turn) and the row's
    columns: ``prompt_ids`` (the dataset's tokenized prompt, list[int]), ``raw_prompt`` (its chat messages),
    ``request_id`` (unique per sample, the same for all its turns), ``tools_kwargs``, ``interaction_kwargs``,
    ``extra_info`` and every other non-tensor column of the batch.
    """

    def __init__(self, context: AgentLoopContext) -> None:
        self.context = context
        self.config = context.rollout_config
        self.tokenizer = context.tokenizer
        self.client = context.client
        self.response_length = int(context.response_length)

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        """Run one sample to its end and return its conversation."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `async def run(self, sampling_params, **sample)`"
        )


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampler seed of a sample's ``turn``-th model turn (0-based): the sample's seed for the first turn
    (so a single-turn sample samples what the sync path samples for its row), then a distinct derived seed."""
    if seed is None:
        return None
    return int(seed) if turn == 0 else (int(seed) * 1_000_003 + 7_919 * turn) % (1 << 63)


__all__ = ["AgentLoopBase", "AgentLoopContext", "AgentLoopOutput", "turn_seed"]
