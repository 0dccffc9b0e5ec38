"""Agent loops for ``rollout.mode=async``: multi-turn rollouts with tools and interactions (verl's agent loop).

* :mod:`verl.agents.base`: the interface (:class:`AgentLoopBase`, :class:`AgentLoopOutput`, :class:`AgentLoopContext`);
* :mod:`verl.agents.single_turn`, :mod:`verl.agents.tool_agent`: the built-in loops ``single_turn_agent``
  (alias ``single_turn``) and ``tool_agent``, provided through the ``verl_agent_loops`` plugin hook;
* :mod:`verl.agents.tool_parser`: tool-call parsers (``hermes``), pluggable by name (``multi_turn.format``);
* :mod:`verl.agents.chat`: token ids of a conversation built turn by turn;
* :mod:`verl.agents.client`, :mod:`verl.agents.manager`: the load-balanced server client and the manager that runs
  one coroutine per sample and assembles the trainer's batch.

Tools live in :mod:`verl.tools`, interactions in :mod:`verl.interactions`; see ``docs/agents.md``.
"""

from verl.agents.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, turn_seed

__all__ = ["AgentLoopBase", "AgentLoopContext", "AgentLoopOutput", "turn_seed"]
