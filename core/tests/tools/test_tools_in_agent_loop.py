"""The shipped tools, loaded from their shipped YAML files, inside the real ``tool_agent`` loop; the model is a
scripted server (a stand-in replaying fixed turns), so every tool reply and reward is known in advance."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import attrs
import pytest

import verl.tools
from verl.agents.base import AgentLoopContext
from verl.agents.tool_agent import ToolAgentLoop
from verl.config import RootConfig
from verl.testing.distributed import load_script
from verl.testing.tiny import make_tiny_tokenizer
from verl.tools.config import load_tools
from verl.tools.isolation import box_unavailable_reason

CONFIGS = Path(verl.tools.__file__).with_name("configs")
SCRIPTED = load_script(Path(__file__).parents[1] / "agents" / "scripted.py", "tools_scripted")


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call><|im_end|>"


def run_loop(tok, config: str, script: list[str], tools_kwargs: dict, response_length: int = 400):
    tools = {t.name: t for t in load_tools(CONFIGS / config)}
    server = SCRIPTED.ScriptedServer(tok, script)
    cfg = RootConfig().actor_rollout_ref.rollout
    context = AgentLoopContext(
        rollout_config=attrs.evolve(cfg, mode="async"),
        tokenizer=tok,
        client=server,
        response_length=response_length,
        tools=tools,
        interactions={},
    )
    row = {
        "raw_prompt": [{"role": "user", "content": "2+3?"}],
        "request_id": "r0",
        "prompt_ids": [],
        "tools_kwargs": tools_kwargs,
    }
    out = asyncio.run(ToolAgentLoop(context).run({"temperature": 1.0, "seed": 1}, **row))
    return out, server, tools


def tool_replies(tok, server) -> list[str]:
    text = tok.decode(server.calls[-1]["prompt_ids"], skip_special_tokens=False)
    return [part.split("<|im_end|>")[0] for part in text.split("<|im_start|>tool\n")[1:]]


def test_gsm8k_tool_rewards_through_the_loop(tok):
    script = [
        call("calc_gsm8k_reward", {"answer": "4"}),
        call("calc_gsm8k_reward", {"answer": "5"}),
        "#### 5<|im_end|>",
    ]
    kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "5"}}}
    out, server, tools = run_loop(tok, "gsm8k_tool_config.yaml", script, kwargs)
    assert tool_replies(tok, server) == ["Current parsed answer='4' reward=0.0", "Current parsed answer='5' reward=1.0"]
    # 4: 0.0 is not above 0.0 -> -0.05; 5: 1.0 > 0.0 -> 0.0; the final reward is the last score
    assert out.extra_fields["tool_rewards"] == [-0.05, 0.0]
    assert out.extra_fields["tool_final_rewards"] == {"calc_gsm8k_reward": 1.0}
    assert out.metrics["tool_calls"] == 2 and out.metrics["tool_errors"] == 0
    assert tools["calc_gsm8k_reward"]._instances == {}  # released


def test_gsm8k_tool_without_ground_truth_is_a_counted_error_not_a_crash(tok):
    out, server, _ = run_loop(tok, "gsm8k_tool_config.yaml", [call("calc_gsm8k_reward", {"answer": "5"}), "ok"], {})
    (reply,) = tool_replies(tok, server)
    assert reply.startswith("Error executing tool 'calc_gsm8k_reward': ValueError: calc_gsm8k_reward: create()")
    assert out.metrics["tool_errors"] == 1


def test_code_interpreter_through_the_loop(tok):
    if reason := box_unavailable_reason():  # the shipped code interpreter refuses to run without a box
        pytest.skip(reason)
    script = [
        call("code_interpreter", {"code": "print(2 + 3)"}),
        call("code_interpreter", {"code": "import socket\nsocket.socket().connect(('127.0.0.1', 9))"}),
        call("code_interpreter", {"source": "x"}),
        "#### 5<|im_end|>",
    ]
    kwargs = {"code_interpreter": {"create_kwargs": None}}  # what verl data gsm8k --tools writes
    out, server, _ = run_loop(tok, "code_interpreter_config.yaml", script, kwargs, response_length=2000)
    first, second, third = tool_replies(tok, server)
    assert first == "5\n"
    assert "PermissionError: socket.connect is not allowed" in second
    assert third == (
        "Error: wrong arguments for 'code_interpreter': missing required argument(s) 'code'; "
        "unknown argument(s) 'source' (expected: 'code')"
    )
    assert out.metrics["tool_calls"] == 3 and out.metrics["tool_errors"] == 1
    assert out.extra_fields["tool_rewards"] == [0.0, 0.0]
