"""Test stand-ins for the agent-loop tests: a scripted server (a recorded conversation replayed) and small tools.

``ScriptedServer`` is a stand-in for a rollout server: it returns the next scripted model turn of each request
id, so a test knows every token the "model" produced; it shows the agent loop's bookkeeping (ids, masks,
log-probs, limits), not that any engine generates. The HF server's own tests run a real tiny model.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from verl.engines.serving import TokenOutput, check_sampling_params

LOGPROB = -0.25  # every scripted token's "log-prob": distinct from the 0.0 tool tokens get


class ScriptedServer:
    """Replays ``script`` (a list of model turns as text) for every request id; records each call."""

    def __init__(self, tokenizer: Any, script: list[str], *, delay_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.script = list(script)
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []
        self._turn: dict[str, int] = defaultdict(int)

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict) -> TokenOutput:
        check_sampling_params(sampling_params, owner="ScriptedServer")
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        turn = self._turn[request_id]
        self._turn[request_id] += 1
        ids = self.ids(self.script[min(turn, len(self.script) - 1)])
        cap = int(sampling_params["max_tokens"])
        reason = "length" if len(ids) > cap else "stop"
        ids = ids[:cap]
        logprobs = [LOGPROB] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason=reason)


class Schema:
    """The ``tool_schema`` duck the agent loop reads (``check_arguments``): required keys only."""

    def __init__(self, required: list[str]) -> None:
        self.required = required

    def check_arguments(self, args: dict) -> str | None:
        missing = [k for k in self.required if k not in args]
        return f"missing required argument(s) {missing}" if missing else None


class AddTool:
    """``add(a, b)``: replies with the sum; step reward 0.1; final reward 1.0 if it was ever called."""

    name = "add"
    timeout_s = 5.0

    def __init__(self, reply: str | None = None, *, raises: bool = False, hang_s: float = 0.0) -> None:
        self.tool_schema = Schema(["a", "b"])
        self.reply = reply
        self.raises = raises
        self.hang_s = hang_s
        self.created: list[dict] = []
        self.released: list[str] = []
        self.executed: list[dict] = []

    def get_openai_tool_schema(self) -> dict:
        return {
            "type": "function",
            "function": {
                "name": "add",
                "description": "add two numbers",
                "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
            },
        }

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        self.created.append(kwargs)
        return f"inst{len(self.created)}", None

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> tuple[Any, float, dict]:
        self.executed.append(parameters)
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        if self.raises:
            raise RuntimeError("boom")
        text = self.reply if self.reply is not None else str(parameters["a"] + parameters["b"])
        return _Response(text), 0.1, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 1.0 if self.executed else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.released.append(instance_id)


class _Response:
    def __init__(self, text: str) -> None:
        self.text = text


class RetryInteraction:
    """verl's gsm8k interaction shape: "correct" when the last assistant message contains ``answer``."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.started: list[dict] = []
        self.finalized: list[str] = []

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        self.started.append(kwargs)
        return instance_id or "i0"

    async def generate_response(self, instance_id: str, messages: list[dict], **kwargs: Any):
        ok = self.answer in messages[-1]["content"]
        return ok, ("correct" if ok else "wrong, try again"), (1.0 if ok else 0.0), {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self.finalized.append(instance_id)
