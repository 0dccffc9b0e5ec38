"""The ``tool_agent`` loop on a recorded conversation (``ScriptedServer``, a stand-in for the model): every id,
mask bit and log-prob of the response is checked against what the conversation must produce, built by hand."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import attrs
import pytest

from verl.agents.base import AgentLoopContext
from verl.agents.tool_agent import ToolAgentLoop, truncate_tool_text
from verl.config import RootConfig
from verl.testing.distributed import load_script
from verl.testing.tiny import make_tiny_tokenizer

_S = load_script(Path(__file__).with_name("scripted.py"), "agents_scripted")
LOGPROB, AddTool, RetryInteraction, ScriptedServer = _S.LOGPROB, _S.AddTool, _S.RetryInteraction, _S.ScriptedServer

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>'
ANSWER = "#### 5<|im_end|>"
MESSAGES = [{"role": "system", "content": "use add"}, {"role": "user", "content": "2+3?"}]


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def _rollout(**multi_turn):
    cfg = RootConfig().actor_rollout_ref.rollout
    return attrs.evolve(cfg, mode="async", multi_turn=attrs.evolve(cfg.multi_turn, **multi_turn))


def _run(tok, script, *, tools=None, interactions=None, response_length=200, sample=None, **multi_turn):
    server = ScriptedServer(tok, script)
    context = AgentLoopContext(
        rollout_config=_rollout(**multi_turn),
        tokenizer=tok,
        client=server,
        response_length=response_length,
        tools=tools if tools is not None else {"add": AddTool()},
        interactions=interactions or {},
    )
    loop = ToolAgentLoop(context)
    row = {"raw_prompt": MESSAGES, "request_id": "r0", "prompt_ids": [], **(sample or {})}
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "seed": 11}
    out = asyncio.run(loop.run(params, **row))
    return out, server, context


def ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_call_then_answer_ids_masks_logprobs_token_by_token(tok):
    tool = AddTool()
    out, server, _ = _run(tok, [CALL, ANSWER], tools={"add": tool})
    prompt = ids(
        tok, "<|im_start|>system\nuse add<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    # ChatML after a turn that ended with <|im_end|>: "\n", the tool message, the next generation prompt.
    tool_turn = ids(tok, "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    assert out.prompt_ids == prompt
    assert out.response_ids == ids(tok, CALL) + tool_turn + ids(tok, ANSWER)
    assert out.response_mask == [1] * len(ids(tok, CALL)) + [0] * len(tool_turn) + [1] * len(ids(tok, ANSWER))
    assert out.response_logprobs == [LOGPROB] * len(ids(tok, CALL)) + [0.0] * len(tool_turn) + [LOGPROB] * len(
        ids(tok, ANSWER)
    )
    assert out.num_turns == 4  # prompt + 2 model turns + 1 tool turn (verl's count)
    # The second request is the whole conversation so far; its budget is what is left.
    assert server.calls[1]["prompt_ids"] == prompt + ids(tok, CALL) + tool_turn
    assert server.calls[1]["params"]["max_tokens"] == 200 - len(ids(tok, CALL)) - len(tool_turn)
    assert server.calls[0]["params"]["seed"] == 11 and server.calls[1]["params"]["seed"] not in (11, None)
    assert tool.executed == [{"a": 2, "b": 3}] and tool.released == ["inst1"]
    assert out.extra_fields["tool_rewards"] == [0.1] and out.extra_fields["tool_final_rewards"] == {"add": 1.0}
    assert out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 0
    assert out.metrics["tokenization_mismatch"] == 0.0  # char-level ids re-render exactly


def test_create_kwargs_come_from_tools_kwargs(tok):
    tool = AddTool()
    _run(
        tok,
        [CALL, ANSWER],
        tools={"add": tool},
        sample={"extra_info": {"tools_kwargs": {"add": {"create_kwargs": {"x": 1}}}}},
    )
    assert tool.created == [{"x": 1}]


@pytest.mark.parametrize(
    ("call", "reply_start", "counter"),
    [
        (
            '<tool_call>{"name": "add", "arguments": {"a": 2</tool_call><|im_end|>',
            "Error: the tool call could not be parsed",
            "tool_parse_errors",
        ),
        (
            '<tool_call>{"name": "mul", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>',
            "Error: unknown function 'mul'",
            "tool_errors",
        ),
        (
            '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call><|im_end|>',
            "Error: wrong arguments for 'add'",
            "tool_errors",
        ),
    ],
)
def test_malformed_calls_become_replies_and_are_counted(tok, call, reply_start, counter):
    tool = AddTool()
    out, server, _ = _run(tok, [call, ANSWER], tools={"add": tool})
    text = tok.decode(server.calls[1]["prompt_ids"], skip_special_tokens=False)
    tool_text = text.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0]
    assert tool_text.startswith(reply_start)
    assert out.metrics[counter] == 1
    assert tool.executed == []
    assert out.response_ids[-len(ids(tok, ANSWER)) :] == ids(tok, ANSWER)  # the sample went on to its answer


def test_raising_and_hanging_tools_are_counted_not_fatal(tok):
    out, server, _ = _run(tok, [CALL, ANSWER], tools={"add": AddTool(raises=True)})
    assert out.metrics["tool_errors"] == 1
    assert "Error executing tool 'add': RuntimeError: boom" in tok.decode(server.calls[1]["prompt_ids"])
    hanging = AddTool(hang_s=30)
    hanging.timeout_s = 0.2
    out, server, _ = _run(tok, [CALL, ANSWER], tools={"add": hanging})
    assert out.metrics["tool_timeouts"] == 1 and out.metrics["tool_errors"] == 1
    assert "did not answer within 0.2 s" in tok.decode(server.calls[1]["prompt_ids"])


def test_long_tool_response_truncated_with_marker(tok):
    out, server, _ = _run(tok, [CALL, ANSWER], tools={"add": AddTool(reply="x" * 50)}, max_tool_response_length=10)
    text = tok.decode(server.calls[1]["prompt_ids"])
    assert "<|im_start|>tool\nxxxxx...(truncated)...xxxxx<|im_end|>" in text
    assert out.metrics["tool_truncated"] == 1
    assert truncate_tool_text("abcdef", 4, "left") == ("(truncated)...cdef", True)
    assert truncate_tool_text("abcdef", 4, "right") == ("abcd...(truncated)", True)
    assert truncate_tool_text("abc", 4, "middle") == ("abc", False)


def test_turn_limit_ends_cleanly_with_mask_intact(tok):
    out, server, _ = _run(tok, [CALL, CALL, CALL], max_assistant_turns=2)
    n_call = len(ids(tok, CALL))
    assert len(server.calls) == 2
    tool_turn = ids(tok, "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    assert out.response_mask == [1] * n_call + [0] * len(tool_turn) + [1] * n_call
    assert out.num_turns == 4


def test_budget_stops_before_a_tool_response_that_would_overflow(tok):
    n_call = len(ids(tok, CALL))
    out, server, _ = _run(tok, [CALL, ANSWER], response_length=n_call + 5)
    assert out.response_ids == ids(tok, CALL) and out.response_mask == [1] * n_call
    assert out.metrics["stopped_by_budget"] == 1.0 and len(server.calls) == 1


def test_length_cut_turn_ends_the_sample(tok):
    out, server, _ = _run(tok, [CALL], response_length=10)
    assert out.response_ids == ids(tok, CALL)[:10] and len(server.calls) == 1


def test_interaction_retry_turn_scores_and_masks(tok):
    inter = RetryInteraction("#### 5")
    kwargs = {"name": "retry", "ground_truth": "5"}
    out, server, _ = _run(
        tok,
        ["#### 4<|im_end|>", ANSWER],
        interactions={"retry": inter},
        sample={"extra_info": {"interaction_kwargs": kwargs}},
    )
    user_turn = ids(tok, "\n<|im_start|>user\nwrong, try again<|im_end|>\n<|im_start|>assistant\n")
    first = ids(tok, "#### 4<|im_end|>")
    assert out.response_ids == first + user_turn + ids(tok, ANSWER)
    assert out.response_mask == [1] * len(first) + [0] * len(user_turn) + [1] * len(ids(tok, ANSWER))
    assert out.extra_fields["turn_scores"] == [0.0, 1.0]
    assert inter.started == [kwargs] and inter.finalized == ["r0"]


def test_unknown_interaction_name_is_an_error_naming_it(tok):
    with pytest.raises(ValueError, match="interaction_kwargs.name='nope'"):
        _run(
            tok,
            [ANSWER],
            interactions={"retry": RetryInteraction("5")},
            sample={"interaction_kwargs": {"name": "nope"}},
        )


def test_missing_raw_prompt_names_the_data_key(tok):
    server = ScriptedServer(tok, [ANSWER])
    context = AgentLoopContext(rollout_config=_rollout(), tokenizer=tok, client=server, response_length=50)
    with pytest.raises(ValueError, match="data.return_raw_chat"):
        asyncio.run(ToolAgentLoop(context).run({"max_tokens": 1}, request_id="r", prompt_ids=[1]))


def test_parallel_calls_capped_and_run_concurrently(tok):
    two = "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 1}}) + "</tool_call>"
    tool = AddTool(hang_s=0.3)
    out, _, _ = _run(
        tok, [two * 3 + "<|im_end|>", ANSWER], tools={"add": tool}, max_parallel_calls=2, response_length=400
    )
    assert len(tool.executed) == 2 and out.metrics["tool_calls"] == 2
    assert out.metrics["tool_s"] < 0.55  # two 0.3 s calls together, not one after the other
