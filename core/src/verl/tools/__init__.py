"""Tools the model calls in multi-turn rollouts (verl's ``verl/tools/``; used by :mod:`verl.agents.tool_agent`).

* :mod:`verl.tools.schemas`: :class:`ToolSchema` (the OpenAI function schema, argument checks) and
  :class:`ToolResponse`;
* :mod:`verl.tools.base`: :class:`BaseTool`, the async lifecycle ``create`` / ``execute`` / ``calc_reward`` /
  ``release``;
* :mod:`verl.tools.config`: :func:`~verl.tools.config.load_tools` for ``multi_turn.tool_config_path`` files;
* built-in tools: :mod:`verl.tools.gsm8k` (``calc_gsm8k_reward``), :mod:`verl.tools.code_interpreter`
  (``code_interpreter``, local, each call in a box: :mod:`verl.tools.isolation`, :mod:`verl.tools.sandbox`) and
  :mod:`verl.tools.sandbox_fusion` (``code_interpreter`` on a sandbox-fusion server); YAML files for the first
  two are in ``verl/tools/configs/``.

Importing this package imports only the schema and base modules.
"""

from verl.tools.base import BaseTool
from verl.tools.schemas import ToolResponse, ToolSchema

__all__ = ["BaseTool", "ToolResponse", "ToolSchema"]
