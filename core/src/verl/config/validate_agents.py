"""Checks of ``rollout.mode=async`` and its ``multi_turn`` / ``agent`` sections, run by ``validate_config``.

* ``multi_turn.enable``, a tool or interaction file, with ``mode=sync``: refused (only agent loops read them);
* ``mode=async`` with ``tensor_model_parallel_size > 1``: refused (the ranks of a replica would have to run the
  same requests in the same order; not built);
* verl keys not built here (``function_tool_path``, ``use_inference_chat_template=true``,
  ``num_repeat_rollouts``, ``agent.custom_async_server``): refused when set, naming what to use;
* ranges of the limits, the tool-call parser name, and the tool / interaction / agent-loop files loaded once
  here, so a typo in them fails at config load rather than at the first rollout.

Whether the rollout engine can serve (capability ``async_server``) and whether ``agent.default_agent_loop``
names an installed agent loop are checked with the plugins (:mod:`verl.config.backend_options`).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig

KEY = "actor_rollout_ref.rollout"


def check_agents(cfg: RootConfig, report: IssueCollector) -> None:
    """Add the errors of the rules above to ``report``."""
    rollout = cfg.actor_rollout_ref.rollout
    mt, agent = rollout.multi_turn, rollout.agent
    if rollout.mode == "sync":
        for name, value in (
            ("enable", mt.enable),
            ("tool_config_path", mt.tool_config_path),
            ("interaction_config_path", mt.interaction_config_path),
        ):
            if value:
                report.error(
                    f"{KEY}.multi_turn.{name}",
                    f"={value!r} is read by the agent loops of rollout.mode=async only; set "
                    f"{KEY}.mode=async (or unset it)",
                )
        return
    if rollout.tensor_model_parallel_size > 1:
        report.error(
            f"{KEY}.tensor_model_parallel_size",
            f"={rollout.tensor_model_parallel_size} with mode=async: a tensor-parallel server would need every rank "
            "of a replica to run the same requests in the same order, which is not built; use "
            "tensor_model_parallel_size=1 (replicas come from the trainer's world) or mode=sync",
        )
    not_built = (
        ("multi_turn.function_tool_path", mt.function_tool_path, "list the tools in multi_turn.tool_config_path"),
        (
            "multi_turn.use_inference_chat_template",
            mt.use_inference_chat_template,
            "only the recorded token ids are built (false), so training sees exactly what was sampled",
        ),
        ("multi_turn.num_repeat_rollouts", mt.num_repeat_rollouts, "use rollout.n for repeats"),
        ("agent.custom_async_server.path", agent.custom_async_server.path, "servers come from the rollout engine"),
        ("agent.custom_async_server.name", agent.custom_async_server.name, "servers come from the rollout engine"),
    )
    for name, value, fix in not_built:
        if value:
            report.error(f"{KEY}.{name}", f"={value!r} is not built here: {fix}")
    for name, value in (
        ("multi_turn.max_parallel_calls", mt.max_parallel_calls),
        ("multi_turn.max_tool_response_length", mt.max_tool_response_length),
        ("multi_turn.max_assistant_turns", mt.max_assistant_turns),
        ("multi_turn.max_user_turns", mt.max_user_turns),
        ("agent.num_workers", agent.num_workers),
    ):
        if value is not None and value < 1:
            report.error(f"{KEY}.{name}", f"must be >= 1 (or null where allowed), got {value}")
    from verl.agents.tool_parser import ToolParser

    if mt.format not in ToolParser.names():
        report.error(
            f"{KEY}.multi_turn.format", f"={mt.format!r} is not a tool-call parser; known: {ToolParser.names()}"
        )
    _check_files(cfg, report)


def _check_files(cfg: RootConfig, report: IssueCollector) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    mt = rollout.multi_turn
    if mt.tool_config_path:
        from verl.tools.config import load_tools

        try:
            load_tools(mt.tool_config_path)
        except Exception as exc:
            report.error(f"{KEY}.multi_turn.tool_config_path", str(exc))
    if mt.interaction_config_path:
        from verl.interactions.config import load_interactions

        try:
            load_interactions(mt.interaction_config_path)
        except Exception as exc:
            report.error(f"{KEY}.multi_turn.interaction_config_path", str(exc))
    if rollout.agent.agent_loop_config_path:
        from verl.agents.registry import load_agent_loop_config

        try:
            load_agent_loop_config(rollout.agent.agent_loop_config_path)
        except Exception as exc:
            report.error(f"{KEY}.agent.agent_loop_config_path", str(exc))


__all__ = ["check_agents"]
