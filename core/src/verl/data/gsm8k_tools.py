"""The tool parts of multi-turn GSM8K rows (``verl data gsm8k --tools NAME``).

Mirrors verl's ``examples/data_preprocess/gsm8k_multiturn_w_tool.py`` (its last version before verl removed
interactions, commit ``63dc08501^``, plus ``agent_name`` from ``074084c83``): a row gains

* ``agent_name``: ``"tool_agent"`` (the agent loop :mod:`verl.agents.tool_agent` runs it);
* a system message in front of the user message: what the tool does, its JSON schema and one call written out
  in the hermes format ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* in ``extra_info``: ``need_tools_kwargs`` (``True``), ``tools_kwargs`` (``{tool: {"create_kwargs": ...}}``, the
  keyword arguments of the tool's ``create``) and ``interaction_kwargs`` (verl's gsm8k interaction fields
  ``{"name": "gsm8k", "query", "ground_truth"}``).

Why the schema goes into the system text rather than ``apply_chat_template(tools=...)``: SmolLM2's ChatML
template ignores ``tools``, and a 135M model needs the call syntax spelled out once to produce it at all.
verl's own system text only names the tool; this one is longer (137 SmolLM2 tokens with ``code_interpreter``,
184 with ``calc_gsm8k_reward``, whose schema is verl's wordier one). Measured with the SmolLM2-135M-Instruct
tokenizer over the shipped GSM8K, the longest whole prompt (chat template + generation prompt) is 389 tokens
(train; 354 test) with ``code_interpreter`` and 436 (train; 401 test) with ``calc_gsm8k_reward``, so every
prompt fits ``data.max_prompt_length`` 400 and 448 respectively (the plain rows: 268).

Deviations from verl: ``code_interpreter`` rows store ``create_kwargs`` as null, because parquet cannot hold an
empty struct (the tool takes no per-sample arguments; the ``tool_agent`` loop reads null as none). The user
message keeps the plain rows' instruction (``"####"`` in quotes) so both datasets ask for the same answer
format the gsm8k scorer checks (verl's tool file writes it in backticks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl.tools import default_schemas

#: The tools ``verl data gsm8k --tools`` can offer (the names in ``verl/tools/configs/*.yaml``).
TOOLS = ("code_interpreter", "calc_gsm8k_reward")
DEFAULT_TOOL = "code_interpreter"
AGENT_NAME = "tool_agent"
INTERACTION_NAME = "gsm8k"

# verl's tool schemas, word for word: examples/sglang_multiturn/config/tool_config/{gsm8k_tool_config,
# sandbox_fusion_tool_config}.yaml (commit 3467d90ae).
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "code_interpreter": default_schemas.CODE_INTERPRETER,
    "calc_gsm8k_reward": default_schemas.CALC_GSM8K_REWARD,
}

#: The one worked call each system prompt shows (arguments of a made-up problem, not of any GSM8K row).
EXAMPLE_ARGUMENTS: dict[str, dict[str, str]] = {
    "code_interpreter": {"code": "print(3 * 12 + 5)"},
    "calc_gsm8k_reward": {"answer": "41"},
}

# The first sentence of each system prompt after the shared opening: what the tool is for.
_TASK = {
    "code_interpreter": "This tool runs Python code and replies with what it prints:",
    "calc_gsm8k_reward": "Check your answer with this tool before you give it; it replies with the reward:",
}


def check_tool(tool: str) -> str:
    """Return ``tool`` when it is one of :data:`TOOLS`.

    Raises:
        ValueError: another name, listing the choices (CLI: ``--tools NAME``).
    """
    if tool not in TOOLS:
        raise ValueError(
            f"tool={tool!r} is not a GSM8K tool; choose one of {', '.join(TOOLS)} (CLI: --tools NAME, "
            f"default {DEFAULT_TOOL})"
        )
    return tool


def default_out_dir(tool: str | None) -> Path:
    """The default output folder: ``~/data/gsm8k`` (verl's) for plain rows, ``~/data/gsm8k_tool_<tool>`` with a tool.

    Returned unexpanded (``~`` kept) so help texts can print it. Raises ``ValueError`` for an unknown tool.
    """
    if tool is None:
        return Path("~/data/gsm8k")
    return Path(f"~/data/gsm8k_tool_{check_tool(tool)}")


def tool_call_text(tool: str, arguments: dict[str, Any]) -> str:
    """One hermes-format call: ``<tool_call>{"name": tool, "arguments": arguments}</tool_call>``, the JSON as
    ``json.dumps`` writes it (``", "`` / ``": "`` separators), on one line."""
    return "<tool_call>" + json.dumps({"name": tool, "arguments": arguments}) + "</tool_call>"


def system_prompt(tool: str) -> str:
    """The system message offering ``tool``: what it is for, its schema inside ``<tools></tools>`` and the one
    worked call of :data:`EXAMPLE_ARGUMENTS`.

    The ``<tools>`` block is the hermes layout Qwen's chat templates render, with only the ``function`` part of
    :data:`TOOL_SCHEMAS` (name, description, parameters: 10 SmolLM2 tokens fewer than the full OpenAI dict). The
    ``"####"`` answer format is asked for in the user message, as in the plain rows.

    Raises ``ValueError`` for an unknown tool.
    """
    check_tool(tool)
    schema = json.dumps(TOOL_SCHEMAS[tool]["function"])
    example = tool_call_text(tool, EXAMPLE_ARGUMENTS[tool])
    return (
        f"You are a math expert. Solve the question step by step. {_TASK[tool]}\n"
        f"<tools>\n{schema}\n</tools>\nCall it like this:\n{example}"
    )


def tools_kwargs(tool: str, ground_truth: str) -> dict[str, Any]:
    """``extra_info.tools_kwargs`` of a row: ``{tool: {"create_kwargs": ...}}``.

    ``calc_gsm8k_reward`` gets ``{"ground_truth": ground_truth}`` (verl's, read by ``Gsm8kTool.create``);
    ``code_interpreter`` gets null (no per-sample arguments; see the module docstring). Raises ``ValueError``
    for an unknown tool.
    """
    create = {"ground_truth": ground_truth} if check_tool(tool) == "calc_gsm8k_reward" else None
    return {tool: {"create_kwargs": create}}


def interaction_kwargs(query: str, ground_truth: str) -> dict[str, str]:
    """``extra_info.interaction_kwargs``: verl's ``{"name": "gsm8k", "query": <user text>, "ground_truth"}``."""
    return {"name": INTERACTION_NAME, "query": query, "ground_truth": ground_truth}


def extra_info_fields(tool: str) -> list[tuple[str, Any]]:
    """The pyarrow fields the tool adds to the ``extra_info`` struct (need_tools_kwargs, tools_kwargs,
    interaction_kwargs), matching :func:`tools_kwargs` and :func:`interaction_kwargs`."""
    import pyarrow as pa

    create = pa.struct([("ground_truth", pa.string())]) if check_tool(tool) == "calc_gsm8k_reward" else pa.null()
    return [
        ("need_tools_kwargs", pa.bool_()),
        ("tools_kwargs", pa.struct([(tool, pa.struct([("create_kwargs", create)]))])),
        (
            "interaction_kwargs",
            pa.struct([("name", pa.string()), ("query", pa.string()), ("ground_truth", pa.string())]),
        ),
    ]
