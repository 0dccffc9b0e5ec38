"""verl's ``verl.utils.reward_score`` import path: ``default_compute_score`` and the rule scorers.

``from verl.utils.reward_score import default_compute_score`` gives :func:`verl.rewards.default_compute_score`
(the same object); ``from verl.utils.reward_score import gsm8k`` / ``math_reward`` give modules whose
``compute_score`` is :func:`verl.rewards.gsm8k.compute_score` / :func:`verl.rewards.math.compute_score`.

Differences from verl (verl/utils/reward_score/__init__.py) that code calling ``default_compute_score`` meets:

* for GSM8K it returns a dict ``{"score", "acc", "pred"}`` (verl: the bare float); a custom reward function
  that wraps it and does arithmetic on the result should read ``["score"]``;
* data sources scored: GSM8K (``openai/gsm8k``) and MATH (``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,
  ``HuggingFaceH4/MATH-500``, and ``math``, which verl scores with its ``math_dapo`` scorer); any other raises
  :class:`verl.rewards.UnknownDataSourceError`, a ``ValueError`` (verl: ``NotImplementedError``), naming the
  supported ones;
* keyword arguments are the scorers' options (``method``, ``format_score``, ``score``, ``clip_chars``); verl's
  sandbox arguments (``sandbox_fusion_url``, ``concurrent_semaphore``, ``memory_limit_mb``) are refused with
  :class:`verl.rewards.UnknownRewardKwargError`, as is any keyword no built-in scorer takes.

Not provided: verl's deprecated ``_default_compute_score`` and the scorer modules for other datasets
(``geo3k``, ``math_dapo``, ``math_verify``, ``prime_math``, ``prime_code``, ``sandbox_fusion``, ``search_r1_like_qa_em``).
"""

from __future__ import annotations

from verl.rewards.default import default_compute_score

__all__ = ["default_compute_score"]
