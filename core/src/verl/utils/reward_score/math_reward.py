r"""verl's ``verl.utils.reward_score.math_reward`` (called ``math`` before verl #3378): the MATH ``\boxed{}``
scorer of :mod:`verl.rewards.math` (the same objects).

Provided: ``compute_score``, ``is_equiv``, ``last_boxed_only_string``, ``remove_boxed``, ``strip_string``.
Not provided: verl's normalisation helpers ``fix_fracs``, ``fix_a_slash_b``, ``remove_right_units``, ``fix_sqrt``
(private steps of ``strip_string`` here) and ``is_equiv``'s ``verbose`` flag.
"""

from __future__ import annotations

from verl.rewards.math import compute_score, is_equiv, last_boxed_only_string, remove_boxed, strip_string

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "remove_boxed", "strip_string"]
