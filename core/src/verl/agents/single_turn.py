"""``single_turn_agent``: one model turn on the dataset's prompt (verl's ``single_turn_agent_loop.py``).

The prompt ids are the dataset's own (the batch's ``input_ids`` without padding), so with the same per-row seed
this loop samples exactly what ``rollout.mode=sync`` samples for the row.
"""

from __future__ import annotations

import time
from typing import Any

from verl.agents.base import AgentLoopBase, AgentLoopOutput, turn_seed


class SingleTurnAgentLoop(AgentLoopBase):
    """Generate one response of at most ``response_length`` tokens; ``num_turns`` is 2 (prompt + answer)."""

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        prompt = list(sample["prompt_ids"])
        params = {
            **sampling_params,
            "max_tokens": self.response_length,
            "seed": turn_seed(sampling_params.get("seed"), 0),
        }
        start = time.perf_counter()
        out = await self.client.generate(sample["request_id"], prompt, params)
        ids = list(out.token_ids)[: self.response_length]
        logprobs = None if out.log_probs is None else [float(x) for x in out.log_probs[: len(ids)]]
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=ids,
            response_mask=[1] * len(ids),
            response_logprobs=logprobs,
            num_turns=2,
            metrics={"generate_s": time.perf_counter() - start},
        )


__all__ = ["SingleTurnAgentLoop"]
