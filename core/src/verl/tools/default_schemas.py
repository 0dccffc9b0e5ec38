"""The OpenAI function schemas of the shipped tools, verl's wording (``examples/sglang_multiturn/config/
tool_config/{gsm8k_tool_config,sandbox_fusion_tool_config}.yaml``); one copy for the tools and the data writer."""

from __future__ import annotations

from typing import Any

CODE_INTERPRETER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}

CALC_GSM8K_REWARD: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": (
            "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed "
            "answer is incorrect or not correctly parsed)"
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "answer": {
                    "type": "string",
                    "description": "The model's answer to the GSM8K math problem, must be a digits",
                }
            },
            "required": ["answer"],
        },
    },
}

__all__ = ["CALC_GSM8K_REWARD", "CODE_INTERPRETER"]
