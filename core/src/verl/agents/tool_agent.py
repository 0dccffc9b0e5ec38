"""``tool_agent``: the model calls tools (and talks to an interaction) over several turns (verl's ToolAgentLoop).

Per sample: render the chat messages (+ the tool schemas) into the first prompt; then repeat

1. generate a model turn (mask 1) with at most the response budget left, stopping at the parser's stop tokens;
2. stop when the budget is spent, the turn was cut by length, or ``max_assistant_turns`` / ``max_user_turns``
   is reached;
3. parse tool calls (``multi_turn.format``, :mod:`verl.agents.tool_parser`). With calls (or malformed calls),
   run at most ``max_parallel_calls`` of them concurrently, each under its tool's timeout, and append the tool
   responses (mask 0, over-long ones truncated with verl's markers). Without calls and with an interaction for
   the sample (``interaction_kwargs.name``), ask it for the next user turn (mask 0) and its turn score; it may end
   the conversation. Otherwise stop.

Bad input never crashes a sample: malformed JSON, an unknown tool, wrong arguments, a tool that raises or hangs
become a tool response telling the model what was wrong, counted in the sample's metrics (``tool_parse_errors``,
``tool_errors``, ``tool_timeouts``). A tool response that would overflow the budget ends the sample before it is
appended (verl), so the response always ends on a model turn. Source: verl
``verl/experimental/agent_loop/tool_agent_loop.py`` (limits, truncation markers, messages) and verl 0.5's
interaction flow (``verl/workers/rollout/sglang_rollout``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from verl.agents import chat
from verl.agents.base import AgentLoopBase, AgentLoopOutput, turn_seed

logger = logging.getLogger(__name__)


def truncate_tool_text(text: str, limit: int, side: str) -> tuple[str, bool]:
    """verl's truncation of a tool response over ``limit`` characters: ``(text, truncated)``.

    ``left`` keeps the end (``"(truncated)..." + tail``), ``right`` the start (``head + "...(truncated)"``),
    ``middle`` both halves around ``"...(truncated)..."``.
    """
    if len(text) <= limit:
        return text, False
    if side == "left":
        return "(truncated)..." + text[-limit:], True
    if side == "right":
        return text[:limit] + "...(truncated)", True
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[-half:], True


class ToolAgentLoop(AgentLoopBase):
    """Multi-turn tool use; see the module docstring. Needs the row's ``raw_prompt`` (``data.return_raw_chat``)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        from verl.agents.tool_parser import ToolParser

        mt = self.config.multi_turn
        self.mt = mt
        self.tools = dict(context.tools)
        self.interactions = dict(context.interactions)
        self.parser = ToolParser.get(mt.format, self.tokenizer)
        self.schemas = [tool.get_openai_tool_schema() for tool in self.tools.values()]
        self.eos_text = self.tokenizer.eos_token or ""

    # ------------------------------------------------------------------ the loop

    async def run(self, sampling_params: dict[str, Any], **sample: Any) -> AgentLoopOutput:
        if sample.get("raw_prompt") is None:
            raise ValueError("tool_agent needs each row's chat messages: set data.return_raw_chat=true")
        messages = [dict(m) for m in sample["raw_prompt"]]
        tools_kwargs = _mapping(sample.get("tools_kwargs")) or _mapping(
            _mapping(sample.get("extra_info")).get("tools_kwargs")
        )
        inter_kwargs = _mapping(sample.get("interaction_kwargs")) or _mapping(
            _mapping(sample.get("extra_info")).get("interaction_kwargs")
        )
        request_id = sample["request_id"]
        template_kwargs = self.context.template_kwargs
        prompt = chat.prompt_ids(self.tokenizer, messages, tools=self.schemas, template_kwargs=template_kwargs)
        metrics = {
            k: 0.0 for k in ("tool_calls", "tool_errors", "tool_parse_errors", "tool_timeouts", "tool_truncated")
        }
        metrics.update(generate_s=0.0, tool_s=0.0)
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        want_logprobs = bool(sampling_params.get("logprobs"))
        instances: dict[str, str] = {}
        turn_scores: list[float] = []
        tool_rewards: list[float] = []
        assistant_turns = user_turns = 0
        interaction, inter_id = await self._start_interaction(inter_kwargs, request_id)
        params = dict(sampling_params)
        if self.parser.stop_token_ids:
            params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | set(self.parser.stop_token_ids))
        try:
            while True:
                budget = self.response_length - len(ids)
                if budget <= 0:
                    break
                params.update(max_tokens=budget, seed=turn_seed(sampling_params.get("seed"), assistant_turns))
                start = time.perf_counter()
                out = await self.client.generate(request_id, prompt + ids, params)
                metrics["generate_s"] += time.perf_counter() - start
                turn = list(out.token_ids)[:budget]
                ids += turn
                mask += [1] * len(turn)
                if want_logprobs:
                    logprobs += [float(x) for x in (out.log_probs or [0.0] * len(turn))[: len(turn)]]
                assistant_turns += 1
                text = self.tokenizer.decode(turn, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})
                if out.stop_reason == "length" or len(ids) >= self.response_length:
                    break
                if self.mt.max_assistant_turns and assistant_turns >= self.mt.max_assistant_turns:
                    break
                if self.mt.max_user_turns and user_turns >= self.mt.max_user_turns:
                    break
                parsed = self.parser.extract_tool_calls(text)
                if parsed.calls or parsed.errors:
                    start = time.perf_counter()
                    replies = await self._tool_turn(parsed, tools_kwargs, instances, metrics, tool_rewards)
                    metrics["tool_s"] += time.perf_counter() - start
                    new = [{"role": "tool", "content": reply} for reply in replies]
                elif interaction is not None:
                    done, reply, score, _ = await interaction.generate_response(inter_id, messages, **inter_kwargs)
                    turn_scores.append(float(score))
                    if done:
                        break
                    new = [{"role": "user", "content": str(reply)}]
                else:
                    break
                ended_with_eos = bool(turn) and turn[-1] in self._eos_ids()
                env_ids = chat.message_ids(
                    self.tokenizer,
                    new,
                    ended_with_eos=ended_with_eos,
                    eos_text=self.eos_text,
                    template_kwargs=template_kwargs,
                )
                if len(ids) + len(env_ids) >= self.response_length:
                    metrics["stopped_by_budget"] = 1.0
                    break
                messages.extend(new)
                ids += env_ids
                mask += [0] * len(env_ids)
                if want_logprobs:
                    logprobs += [0.0] * len(env_ids)
                user_turns += 1
            extra = {"turn_scores": turn_scores, "tool_rewards": tool_rewards}
            extra["tool_final_rewards"] = await self._final_rewards(instances)
        finally:
            await self._release(instances)
            if interaction is not None:
                await interaction.finalize_interaction(inter_id)
        metrics["tokenization_mismatch"] = float(
            chat.template_mismatch(
                self.tokenizer,
                messages,
                prompt + ids,
                mode=self.mt.tokenization_sanity_check_mode,
                tools=self.schemas,
                template_kwargs=template_kwargs,
            )
        )
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=ids,
            response_mask=mask,
            response_logprobs=logprobs if want_logprobs else None,
            num_turns=user_turns + assistant_turns + 1,
            metrics=metrics,
            extra_fields=extra,
        )

    # ------------------------------------------------------------------ tools

    async def _tool_turn(
        self, parsed: Any, tools_kwargs: dict, instances: dict, metrics: dict, tool_rewards: list
    ) -> list[str]:
        """Replies to one model turn's calls (at most ``max_parallel_calls``) and parse errors, in that order."""
        calls = list(parsed.calls)[: max(1, int(self.mt.max_parallel_calls))]
        results = await asyncio.gather(*(self._call(c, tools_kwargs, instances, metrics) for c in calls))
        replies = []
        for text, reward in results:
            if reward is not None:
                tool_rewards.append(float(reward))
            text, cut = truncate_tool_text(
                text, int(self.mt.max_tool_response_length), self.mt.tool_response_truncate_side
            )
            metrics["tool_truncated"] += float(cut)
            replies.append(text)
        for error in parsed.errors:
            metrics["tool_parse_errors"] += 1
            replies.append(f"Error: the tool call could not be parsed: {error}")
        metrics["tool_calls"] += len(calls)
        return replies

    async def _call(self, call: Any, tools_kwargs: dict, instances: dict, metrics: dict) -> tuple[str, float | None]:
        """Run one call; any failure becomes the reply text (never an exception), counted in ``metrics``."""
        tool = self.tools.get(call.name)
        if tool is None:
            metrics["tool_errors"] += 1
            return f"Error: unknown function '{call.name}'. Available tools: {sorted(self.tools)}", None
        try:
            args = json.loads(call.arguments) if call.arguments else {}
        except (json.JSONDecodeError, TypeError) as exc:
            metrics["tool_parse_errors"] += 1
            return f"Error: invalid JSON in the arguments of '{call.name}': {exc}", None
        schema = getattr(tool, "tool_schema", None)
        problem = "arguments must be a JSON object" if not isinstance(args, dict) else None
        if problem is None and hasattr(schema, "check_arguments"):
            problem = schema.check_arguments(args)
        if problem:
            metrics["tool_errors"] += 1
            return f"Error: wrong arguments for '{call.name}': {problem}", None
        timeout = float(getattr(tool, "timeout_s", 30.0) or 30.0)
        try:
            if call.name not in instances:
                create_kwargs = _mapping(_mapping(tools_kwargs.get(call.name)).get("create_kwargs"))
                instances[call.name], _ = await asyncio.wait_for(tool.create(None, **create_kwargs), timeout)
            response, reward, res = await asyncio.wait_for(tool.execute(instances[call.name], args), timeout)
        except asyncio.TimeoutError:
            metrics["tool_errors"] += 1
            metrics["tool_timeouts"] += 1
            return f"Error: tool '{call.name}' did not answer within {timeout:g} s and was stopped", None
        except Exception as exc:  # a raising tool is the model's feedback, never a crashed sample
            logger.warning("tool %r raised: %r", call.name, exc)
            metrics["tool_errors"] += 1
            return f"Error executing tool '{call.name}': {type(exc).__name__}: {exc}", None
        if isinstance(res, dict) and res.get("timed_out"):
            metrics["tool_timeouts"] += 1
        return str(getattr(response, "text", None) or ""), reward

    async def _final_rewards(self, instances: dict) -> dict[str, float]:
        out = {}
        for name, instance_id in instances.items():
            try:
                out[name] = float(await self.tools[name].calc_reward(instance_id))
            except Exception as exc:
                logger.warning("tool %r calc_reward raised: %r", name, exc)
        return out

    async def _release(self, instances: dict) -> None:
        for name, instance_id in instances.items():
            try:
                await self.tools[name].release(instance_id)
            except Exception as exc:
                logger.warning("tool %r release raised: %r", name, exc)

    # ------------------------------------------------------------------ interactions

    async def _start_interaction(self, kwargs: dict, request_id: str) -> tuple[Any, Any]:
        if not kwargs or not self.interactions:
            return None, None
        name = kwargs.get("name")
        if name not in self.interactions:
            raise ValueError(
                f"the row's interaction_kwargs.name={name!r} is not in multi_turn.interaction_config_path "
                f"(known: {sorted(self.interactions)})"
            )
        interaction = self.interactions[name]
        return interaction, await interaction.start_interaction(request_id, **kwargs)

    def _eos_ids(self) -> set[int]:
        ids = getattr(self, "_eos_cache", None)
        if ids is None:
            eos = self.tokenizer.eos_token_id
            ids = self._eos_cache = {int(i) for i in ([eos] if isinstance(eos, int) else list(eos or []))}
        return ids


def _mapping(value: Any) -> dict:
    return dict(value) if isinstance(value, dict) else {}


__all__ = ["ToolAgentLoop", "truncate_tool_text"]
