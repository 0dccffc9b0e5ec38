"""Interactions: a scripted "user" that answers the model between turns (verl 0.5's ``verl/interactions/``,
removed from verl at ``63dc08501``; used by :mod:`verl.agents.tool_agent` when a row has ``interaction_kwargs``).

* :mod:`verl.interactions.base`: :class:`~verl.interactions.base.BaseInteraction`, the async lifecycle
  ``start_interaction`` / ``generate_response`` / ``calculate_score`` / ``finalize_interaction``;
* :mod:`verl.interactions.gsm8k`: ``Gsm8kInteraction`` (verl's: "correct" ends the conversation, otherwise the
  model is asked to try again);
* :mod:`verl.interactions.config`: :func:`~verl.interactions.config.load_interactions` for
  ``multi_turn.interaction_config_path`` files; the shipped file is ``verl/interactions/configs/``.
"""

from verl.interactions.base import BaseInteraction

__all__ = ["BaseInteraction"]
