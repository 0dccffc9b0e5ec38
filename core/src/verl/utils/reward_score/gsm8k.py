"""verl's ``verl.utils.reward_score.gsm8k``: :func:`compute_score` and :func:`extract_solution` of
:mod:`verl.rewards.gsm8k` (the same objects).

Same arguments as verl's (``method="strict"|"flexible"``, ``format_score``, ``score``), plus ``clip_chars``.
Where the results differ from verl's (the whole response is searched unless ``clip_chars=300``; answers compare
as numbers, ``$`` and thousands separators accepted), see :func:`verl.rewards.gsm8k.compute_score` and
docs/decisions.md ("Rule scorers").
"""

from __future__ import annotations

from verl.rewards.gsm8k import compute_score, extract_solution

__all__ = ["compute_score", "extract_solution"]
