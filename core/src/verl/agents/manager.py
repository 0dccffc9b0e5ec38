"""The agent-loop manager of ``rollout.mode=async``: one coroutine per sample against the rollout servers.

:meth:`AgentLoopManager.generate_sequences` takes the batch a sync rollout would get (rows already repeated
``n`` times) and returns the batch a sync rollout returns, in verl's layout (``verl/experimental/agent_loop/
agent_loop.py:_postprocess``): ``prompts`` left-padded to the input's prompt width, ``responses`` /
``response_mask`` / ``rollout_log_probs`` right-padded to ``response_length``, ``input_ids = [prompts |
responses]``, ``attention_mask`` 1 on every real token (tool tokens too), ``position_ids`` from it, and
``response_mask`` the agents' mask (1 on the model's tokens only). Non-tensor outputs: ``__num_turns__`` and the
agents' per-sample counters (``__tool_calls__``, ... see :data:`SAMPLE_METRICS`), plus ``turn_scores`` /
``tool_rewards`` / ``tool_final_rewards`` (``rollout_reward_scores`` of the reward function).

Concurrency (verl's ``AgentLoopManager`` / ``AgentLoopWorker``): the rows are split into
``rollout.agent.num_workers`` chunks; each chunk runs in a thread with its own event loop, every sample of it a
task, so a sample waiting on a tool or on the server never holds up another. All share one
:class:`~verl.agents.client.ServerClient`. The call returns when every sample finished, so nothing is in
flight when the trainer syncs weights or puts the engine to sleep.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from verl.agents.base import AgentLoopContext, AgentLoopOutput
from verl.agents.client import ServerClient

#: agent metric -> the non-tensor column carrying it per sample (the trainer aggregates them).
SAMPLE_METRICS = {
    "tool_calls": "__tool_calls__",
    "tool_errors": "__tool_errors__",
    "tool_parse_errors": "__tool_parse_errors__",
    "tool_timeouts": "__tool_timeouts__",
    "tool_truncated": "__tool_truncated__",
    "tokenization_mismatch": "__tokenization_mismatch__",
    "generate_s": "__agent_generate_s__",
    "tool_s": "__agent_tool_s__",
}
_PASSED_COLUMNS_SKIP = frozenset({"uid"})


class AgentLoopManager:
    """Runs agent loops for batches of samples (see the module docstring).

    Args:
        rollout_config: the ``actor_rollout_ref.rollout`` section.
        servers: the rollout replicas' :class:`~verl.engines.serving.AsyncRolloutServer` objects.
        tokenizer: the model's HF tokenizer (its ``pad_token_id`` pads the batch).
        loops: ``{agent_name: factory}`` (:func:`verl.agents.registry.agent_loop_factories`).
        tools / interactions: ``{name: tool}`` / ``{name: interaction}`` shared by every sample.
        template_kwargs: ``data.apply_chat_template_kwargs``.

    Raises:
        ValueError: ``rollout.agent.default_agent_loop`` is not among ``loops``.
    """

    def __init__(
        self,
        rollout_config: Any,
        servers: Sequence[Any],
        tokenizer: Any,
        loops: Mapping[str, Any],
        *,
        tools: Mapping[str, Any] | None = None,
        interactions: Mapping[str, Any] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = rollout_config
        self.client = ServerClient(servers)
        self.tokenizer = tokenizer
        self.loops = dict(loops)
        self.tools = dict(tools or {})
        self.interactions = dict(interactions or {})
        self.template_kwargs = dict(template_kwargs or {})
        default = rollout_config.agent.default_agent_loop
        if default not in self.loops:
            raise ValueError(
                f"actor_rollout_ref.rollout.agent.default_agent_loop={default!r} is not a known agent loop "
                f"(known: {sorted(self.loops)})"
            )
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else tokenizer.eos_token_id)

    # ------------------------------------------------------------------ public

    def generate_sequences(self, prompts: Any) -> Any:
        """Run every row's agent loop; return the rollout batch (module docstring) with ``meta_info["timing"]``.

        Input: ``batch["input_ids"]``, ``["attention_mask"]`` ``(bs, prompt_len)`` left-padded, optional
        ``["sample_seed"]`` ``(bs,)``; non-tensor ``agent_name`` (else the default loop), ``raw_prompt``,
        ``tools_kwargs`` / ``interaction_kwargs`` / ``extra_info``; ``meta_info`` sampling overrides as for
        :meth:`verl.engines.RolloutEngine.generate` (``validate``, ``do_sample``, ``temperature``, ...,
        ``response_length``).

        Raises:
            ValueError: a row names an unknown agent loop, or its agent's prompt is wider than ``prompt_len``
                (``data.max_prompt_length``); an agent loop's own errors propagate with the row named.
        """
        from verl.protocol import DataProto

        start = time.perf_counter()
        meta = prompts.meta_info or {}
        response_length = int(meta.get("response_length") or self.config.response_length)
        samples = self._samples(prompts)
        params = self._sampling_params(prompts, meta)
        outputs = self._run_all(samples, params, response_length)
        tensors, non_tensors = self._assemble(prompts, outputs, response_length)
        seconds = time.perf_counter() - start
        return DataProto.from_dict(
            tensors=tensors, non_tensors=non_tensors, meta_info={"timing": {"generate_sequences": seconds}}
        )

    # ------------------------------------------------------------------ inputs

    def _samples(self, prompts: Any) -> list[dict[str, Any]]:
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
        columns = {k: v for k, v in prompts.non_tensor_batch.items() if k not in _PASSED_COLUMNS_SKIP}
        default = self.config.agent.default_agent_loop
        samples = []
        for i in range(ids.shape[0]):
            sample = {key: _plain(values[i]) for key, values in columns.items()}
            name = sample.get("agent_name") or default
            if name not in self.loops:
                raise ValueError(
                    f"row {i}: agent_name={name!r} is not a known agent loop (known: {sorted(self.loops)})"
                )
            sample["agent_name"] = name
            sample["prompt_ids"] = ids[i][mask[i]].tolist()
            sample["request_id"] = uuid.uuid4().hex
            samples.append(sample)
        return samples

    def _sampling_params(self, prompts: Any, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
        from verl.engines.reference.sampling import resolve_sampling_params

        sp = resolve_sampling_params(self.config, meta)
        base = {
            "temperature": 0.0 if sp.greedy else float(sp.temperature),
            "top_p": float(sp.top_p),
            "top_k": int(sp.top_k),
            "logprobs": bool(self.config.calculate_log_probs),
        }
        bs = prompts.batch["input_ids"].shape[0]
        if "sample_seed" in prompts.batch.keys():
            seeds = [int(s) for s in prompts.batch["sample_seed"].tolist()]
        elif meta.get("seed") is not None:
            seeds = [int(meta["seed"]) * 100_003 + i for i in range(bs)]
        else:
            seeds = [None] * bs
        return [{**base, "seed": None if sp.greedy else seed} for seed in seeds]

    # ------------------------------------------------------------------ running

    def _run_all(self, samples: list[dict], params: list[dict], response_length: int) -> list[AgentLoopOutput]:
        context = AgentLoopContext(
            rollout_config=self.config,
            tokenizer=self.tokenizer,
            client=self.client,
            response_length=response_length,
            tools=self.tools,
            interactions=self.interactions,
            template_kwargs=self.template_kwargs,
        )
        workers = max(1, min(int(self.config.agent.num_workers), len(samples)))
        bounds = np.linspace(0, len(samples), workers + 1).astype(int)
        chunks = [list(range(bounds[w], bounds[w + 1])) for w in range(workers)]
        results: list[AgentLoopOutput | None] = [None] * len(samples)

        def run_chunk(rows: list[int]) -> None:
            async def one(i: int) -> None:
                loop = self.loops[samples[i]["agent_name"]](context)
                try:
                    out = await loop.run(dict(params[i]), **samples[i])
                    out.check(response_length=response_length, owner=f"agent loop {samples[i]['agent_name']!r}")
                except Exception as exc:
                    note = f"while running row {i} of the rollout batch (agent loop {samples[i]['agent_name']!r})"
                    if hasattr(exc, "add_note"):  # Python >= 3.11
                        exc.add_note(note)
                    raise
                results[i] = out

            async def main() -> None:
                await asyncio.gather(*(one(i) for i in rows))

            asyncio.run(main())

        if workers == 1:
            run_chunk(chunks[0])
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent-loop") as pool:
                for future in [pool.submit(run_chunk, rows) for rows in chunks if rows]:
                    future.result()
        return [r for r in results if r is not None]

    # ------------------------------------------------------------------ output

    def _assemble(
        self, prompts: Any, outputs: list[AgentLoopOutput], response_length: int
    ) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
        width = prompts.batch["input_ids"].shape[1]
        device = prompts.batch["input_ids"].device
        bs = len(outputs)
        pad = self.pad_token_id
        prompt_t = torch.full((bs, width), pad, dtype=torch.long)
        prompt_mask = torch.zeros((bs, width), dtype=torch.long)
        resp_t = torch.full((bs, response_length), pad, dtype=torch.long)
        resp_attn = torch.zeros((bs, response_length), dtype=torch.long)
        resp_mask = torch.zeros((bs, response_length), dtype=torch.long)
        logp = torch.zeros((bs, response_length), dtype=torch.float32)
        for i, out in enumerate(outputs):
            p = len(out.prompt_ids)
            if p > width:
                raise ValueError(
                    f"row {i}: the agent's prompt has {p} tokens but the batch's prompt width is {width} "
                    "(data.max_prompt_length); raise data.max_prompt_length (tool schemas in the chat template "
                    "lengthen prompts) or filter long prompts"
                )
            prompt_t[i, width - p :] = torch.tensor(out.prompt_ids, dtype=torch.long)
            prompt_mask[i, width - p :] = 1
            r = len(out.response_ids)
            if r:
                resp_t[i, :r] = torch.tensor(out.response_ids, dtype=torch.long)
                resp_attn[i, :r] = 1
                resp_mask[i, :r] = torch.tensor(out.response_mask, dtype=torch.long)
                if out.response_logprobs is not None:
                    logp[i, :r] = torch.tensor(out.response_logprobs, dtype=torch.float32) * resp_mask[i, :r]
        attention = torch.cat([prompt_mask, resp_attn], dim=1)
        tensors = {
            "prompts": prompt_t,
            "responses": resp_t,
            "response_mask": resp_mask,
            "input_ids": torch.cat([prompt_t, resp_t], dim=1),
            "attention_mask": attention,
            "position_ids": torch.clip(torch.cumsum(attention, dim=-1) - 1, min=0),
        }
        if self.config.calculate_log_probs:
            tensors["rollout_log_probs"] = logp
        tensors = {k: v.to(device) for k, v in tensors.items()}
        non_tensors: dict[str, np.ndarray] = {
            "__num_turns__": np.array([out.num_turns for out in outputs], dtype=np.int64)
        }
        for name, column in SAMPLE_METRICS.items():
            non_tensors[column] = np.array([float(out.metrics.get(name, 0.0)) for out in outputs], dtype=np.float64)
        for key in ("turn_scores", "tool_rewards", "tool_final_rewards"):
            column = np.empty(bs, dtype=object)
            for i, out in enumerate(outputs):
                column[i] = out.extra_fields.get(key, [] if key != "tool_final_rewards" else {})
            non_tensors[key] = column
        return tensors, non_tensors


def _plain(value: Any) -> Any:
    """A non-tensor cell as plain Python (numpy arrays of messages become lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


__all__ = ["SAMPLE_METRICS", "AgentLoopManager"]
