"""The agent-loop manager: per-row agents, the trainer's batch layout built by hand, the load balancer, and the
chat-template deltas. The model is ``ScriptedServer`` (a recorded conversation, a stand-in)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

from verl.agents.chat import message_ids, turn_end_text
from verl.agents.client import ServerClient
from verl.agents.manager import AgentLoopManager
from verl.agents.registry import agent_loop_factories, load_agent_loop_config
from verl.agents.single_turn import SingleTurnAgentLoop
from verl.agents.tool_agent import ToolAgentLoop
from verl.config import RootConfig
from verl.engines.serving import TokenOutput
from verl.protocol import DataProto
from verl.testing.distributed import load_script
from verl.testing.tiny import make_tiny_tokenizer

_S = load_script(Path(__file__).with_name("scripted.py"), "agents_scripted_m")
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
ANSWER = "#### 5<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _rollout(**kw):
    cfg = RootConfig().actor_rollout_ref.rollout
    return attrs.evolve(cfg, mode="async", response_length=128, **kw)


def _prompts(tok, texts, width, *, agents, seeds=(5, 6)):
    rows = [ids(tok, t) for t in texts]
    input_ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    messages = np.empty(len(rows), dtype=object)
    for i, t in enumerate(texts):
        messages[i] = [{"role": "user", "content": t}]
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": mask, "sample_seed": torch.tensor(seeds[: len(rows)])},
        non_tensors={"agent_name": np.array(agents, dtype=object), "raw_prompt": messages},
        meta_info={},
    )


def test_batch_layout_by_hand_two_agents(tok):
    server = _S.ScriptedServer(tok, [CALL, ANSWER])
    loops = {"single_turn_agent": SingleTurnAgentLoop, "tool_agent": ToolAgentLoop}
    manager = AgentLoopManager(_rollout(), [server], tok, loops, tools={"add": _S.AddTool()})
    width = 40
    out = manager.generate_sequences(_prompts(tok, ["hi", "2+3?"], width, agents=["single_turn_agent", "tool_agent"]))
    b = out.batch
    # Row 0: the dataset's prompt ids as is, one scripted turn (the CALL text; single_turn never parses it).
    p0, r0 = ids(tok, "hi"), ids(tok, CALL)
    # Row 1: the tool agent renders its chat messages; call, tool turn, answer.
    p1 = ids(tok, "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n")
    r1 = ids(tok, CALL) + ids(tok, "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n") + ids(tok, ANSWER)
    m1 = (
        [1] * len(ids(tok, CALL))
        + [0] * (len(r1) - len(ids(tok, CALL)) - len(ids(tok, ANSWER)))
        + [1] * len(ids(tok, ANSWER))
    )
    pad = tok.pad_token_id
    want_prompts = torch.tensor([[pad] * (width - len(p0)) + p0, [pad] * (width - len(p1)) + p1])
    want_resp = torch.tensor([r0 + [pad] * (128 - len(r0)), r1 + [pad] * (128 - len(r1))])
    assert torch.equal(b["prompts"], want_prompts)
    assert torch.equal(b["responses"], want_resp)
    assert torch.equal(b["input_ids"], torch.cat([want_prompts, want_resp], 1))
    assert b["response_mask"][0].tolist() == [1] * len(r0) + [0] * (128 - len(r0))
    assert b["response_mask"][1].tolist() == m1 + [0] * (128 - len(r1))
    attn1 = [0] * (width - len(p1)) + [1] * (len(p1) + len(r1)) + [0] * (128 - len(r1))
    assert b["attention_mask"][1].tolist() == attn1
    assert b["position_ids"][1].tolist() == np.clip(np.cumsum(attn1) - 1, 0, None).tolist()
    lp = b["rollout_log_probs"][1].tolist()
    assert lp == pytest.approx([_S.LOGPROB * m for m in m1] + [0.0] * (128 - len(r1)))
    assert out.non_tensor_batch["__num_turns__"].tolist() == [2, 4]
    assert out.non_tensor_batch["__tool_calls__"].tolist() == [0.0, 1.0]
    assert out.non_tensor_batch["tool_rewards"][1] == [0.1]
    # The first turn of each row carries the row's own sample_seed (the sync path's seed).
    seeds = {c["request_id"]: c["params"]["seed"] for c in reversed(server.calls)}
    assert sorted(seeds.values()) == [5, 6]


def test_default_agent_unknown_agent_and_wide_prompt_errors(tok):
    server = _S.ScriptedServer(tok, [ANSWER])
    loops = {"single_turn_agent": SingleTurnAgentLoop}
    with pytest.raises(ValueError, match="default_agent_loop='single_turn_agent' is not a known agent loop"):
        AgentLoopManager(_rollout(), [server], tok, {"x": SingleTurnAgentLoop})
    manager = AgentLoopManager(_rollout(), [server], tok, loops)
    with pytest.raises(ValueError, match="row 0: agent_name='nope'"):
        manager.generate_sequences(_prompts(tok, ["hi"], 8, agents=["nope"]))
    manager = AgentLoopManager(_rollout(), [server], tok, {**loops, "tool_agent": ToolAgentLoop})
    with pytest.raises(ValueError, match="data.max_prompt_length"):
        manager.generate_sequences(_prompts(tok, ["hi"], 4, agents=["tool_agent"]))


def test_greedy_validation_sends_no_seed_and_val_sampling(tok):
    server = _S.ScriptedServer(tok, [ANSWER])
    manager = AgentLoopManager(_rollout(), [server], tok, {"single_turn_agent": SingleTurnAgentLoop})
    prompts = _prompts(tok, ["hi", "yo"], 8, agents=["single_turn_agent"] * 2)
    prompts.meta_info["validate"] = True
    manager.generate_sequences(prompts)
    assert all(c["params"]["temperature"] == 0.0 and c["params"]["seed"] is None for c in server.calls)


def test_workers_run_samples_concurrently(tok):
    server = _S.ScriptedServer(tok, [ANSWER], delay_s=0.3)
    cfg = _rollout()
    cfg = attrs.evolve(cfg, agent=attrs.evolve(cfg.agent, num_workers=2))
    manager = AgentLoopManager(cfg, [server], tok, {"single_turn_agent": SingleTurnAgentLoop})
    import time

    start = time.perf_counter()
    out = manager.generate_sequences(_prompts(tok, ["a", "b", "c", "d"], 8, agents=[None] * 4, seeds=(1, 2, 3, 4)))
    assert time.perf_counter() - start < 0.9  # 4 x 0.3 s one after the other would be 1.2 s
    assert len(out) == 4 and out.batch["responses"][:, : len(ids(tok, ANSWER))].tolist() == [ids(tok, ANSWER)] * 4


class _Slow:
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def generate(self, request_id, prompt_ids, sampling_params):
        self.seen.append(request_id)
        await asyncio.sleep(0.05)
        return TokenOutput(token_ids=[1])


def test_client_sticky_and_least_in_flight():
    a, b = _Slow(), _Slow()
    client = ServerClient([a, b])

    async def main():
        await asyncio.gather(client.generate("x", [1], {}), client.generate("y", [1], {}))
        await client.generate("x", [1, 2], {})  # the sample's next turn: same server as its first
        await client.generate("y", [1, 2], {})

    asyncio.run(main())
    assert a.seen == ["x", "x"] and b.seen == ["y", "y"]
    assert client.requests_per_server() == [2, 2]
    with pytest.raises(ValueError, match="at least one"):
        ServerClient([])


def test_message_ids_by_hand(tok):
    end, after = turn_end_text(tok, "<|im_end|>")
    assert (end, after) == ("<|im_end|>\n", "\n")
    msg = [{"role": "tool", "content": "42"}]
    assert message_ids(tok, msg, ended_with_eos=True, eos_text="<|im_end|>") == ids(
        tok, "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )
    # A turn cut before its EOS gets the whole end of turn first.
    assert message_ids(tok, msg, ended_with_eos=False, eos_text="<|im_end|>") == ids(
        tok, "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )


def test_builtin_loops_and_config_file(tmp_path):
    loops = agent_loop_factories(None)
    assert loops["single_turn_agent"] is SingleTurnAgentLoop and loops["single_turn"] is SingleTurnAgentLoop
    assert loops["tool_agent"] is ToolAgentLoop
    path = tmp_path / "loops.yaml"
    path.write_text("- name: mine\n  _target_: verl.agents.single_turn.SingleTurnAgentLoop\n")
    assert load_agent_loop_config(path) == {"mine": SingleTurnAgentLoop}
    path.write_text("- name: mine\n  _target_: verl.agents.nope.Loop\n")
    with pytest.raises(ValueError, match="entry 0: cannot import module 'verl.agents.nope'"):
        load_agent_loop_config(path)
    path.write_text("- name: tool_agent\n  _target_: verl.agents.single_turn.SingleTurnAgentLoop\n")
    cfg = attrs.evolve(RootConfig().actor_rollout_ref.rollout.agent, agent_loop_config_path=str(path))
    with pytest.raises(ValueError, match="already provided by a plugin"):
        agent_loop_factories(cfg)
