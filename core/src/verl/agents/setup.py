"""Build the agent-loop manager of a run from its config: loops, tools and interactions loaded once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def build_agent_loop_manager(cfg: Any, servers: Sequence[Any], tokenizer: Any) -> Any:
    """An :class:`~verl.agents.manager.AgentLoopManager` for the root config ``cfg``.

    Tools come from ``rollout.multi_turn.tool_config_path`` (:func:`verl.tools.config.load_tools`), interactions
    from ``multi_turn.interaction_config_path`` (:func:`verl.interactions.config.load_interactions`), agent loops
    from the plugins and ``rollout.agent.agent_loop_config_path``.

    Raises:
        ValueError: a bad tool / interaction / agent-loop file (the loaders name the file and entry).
    """
    from verl.agents.manager import AgentLoopManager
    from verl.agents.registry import agent_loop_factories

    rollout = cfg.actor_rollout_ref.rollout
    tools: dict[str, Any] = {}
    if rollout.multi_turn.tool_config_path:
        from verl.tools.config import load_tools

        tools = {tool.name: tool for tool in load_tools(rollout.multi_turn.tool_config_path)}
    interactions: dict[str, Any] = {}
    if rollout.multi_turn.interaction_config_path:
        from verl.interactions.config import load_interactions

        interactions = dict(load_interactions(rollout.multi_turn.interaction_config_path))
    return AgentLoopManager(
        rollout,
        servers,
        tokenizer,
        agent_loop_factories(rollout.agent),
        tools=tools,
        interactions=interactions,
        template_kwargs=dict(cfg.data.apply_chat_template_kwargs or {}),
    )


__all__ = ["build_agent_loop_manager"]
