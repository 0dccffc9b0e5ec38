"""``default_compute_score``: dispatch to a built-in rule scorer by ``data_source``.

Mirrors verl/utils/reward_score/__init__.py:default_compute_score for the sources this package ships. One
deliberate difference: verl sends ``data_source="math"`` to its DAPO scorer (+1/-1); here it goes to the MATH
``\\boxed{}`` scorer (1/0), the only math scorer shipped.
"""

from __future__ import annotations

from typing import Any

from verl.rewards import gsm8k
from verl.rewards import math as math_reward
from verl.rewards.errors import RewardConfigError, UnknownDataSourceError, UnknownRewardKwargError

__all__ = ["SUPPORTED_DATA_SOURCES", "default_compute_score", "check_data_source", "check_reward_kwargs"]

GSM8K_DATA_SOURCES = ("openai/gsm8k",)
MATH_DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")
SUPPORTED_DATA_SOURCES = GSM8K_DATA_SOURCES + MATH_DATA_SOURCES

# Keyword options each built-in scorer accepts. A keyword meant for another built-in scorer is ignored, so one
# reward_kwargs (e.g. gsm8k's method="flexible") works for a dataset that mixes GSM8K and MATH rows.
_GSM8K_KWARGS = frozenset({"method", "format_score", "score", "clip_chars"})
_MATH_KWARGS: frozenset[str] = frozenset()
_ALL_KWARGS = _GSM8K_KWARGS | _MATH_KWARGS


def _unknown_source_message(data_source: object) -> str:
    return (
        f"no built-in reward function for data_source={data_source!r}. Built-in sources: "
        f"{', '.join(SUPPORTED_DATA_SOURCES)}. To score other data, write a Python file with "
        "`def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict` "
        "and set custom_reward_function.path=/path/to/file.py (custom_reward_function.name selects another "
        "function name, custom_reward_function.reward_kwargs binds extra keywords)."
    )


def check_data_source(data_source: object) -> None:
    """Raise :class:`UnknownDataSourceError` unless ``data_source`` has a built-in scorer."""
    if str(data_source) not in SUPPORTED_DATA_SOURCES:
        raise UnknownDataSourceError(_unknown_source_message(data_source))


def check_reward_kwargs(kwargs: dict[str, Any]) -> None:
    """Raise :class:`UnknownRewardKwargError` for keywords no built-in scorer accepts, and
    :class:`RewardConfigError` for an invalid gsm8k ``method`` or ``clip_chars``."""
    try:
        gsm8k.check_clip_chars(kwargs.get("clip_chars"))
    except ValueError as exc:
        raise RewardConfigError(str(exc)) from None
    if "method" in kwargs and kwargs["method"] not in gsm8k.METHODS:
        raise RewardConfigError(
            f"reward_kwargs method={kwargs['method']!r} is not a gsm8k extraction method; use one of {gsm8k.METHODS}"
        )
    unknown = sorted(set(kwargs) - _ALL_KWARGS)
    if unknown:
        raise UnknownRewardKwargError(
            f"reward_kwargs {unknown} are not accepted by any built-in reward function; accepted: "
            f"{sorted(_ALL_KWARGS)} (gsm8k: method, format_score, score, clip_chars; math: none). Remove them, or use a "
            "custom_reward_function that accepts them."
        )


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score one response with the built-in scorer for ``data_source``.

    Args:
        data_source: dataset name, e.g. ``"openai/gsm8k"`` or ``"HuggingFaceH4/MATH-500"``.
        solution_str: decoded response text.
        ground_truth: reference answer (``reward_model.ground_truth`` of the dataset row).
        extra_info: the row's ``extra_info``; unused by the built-in scorers.
        **kwargs: scorer options; gsm8k takes ``method`` (``"strict"``/``"flexible"``), ``format_score``,
            ``score``, ``clip_chars`` (``300`` = verl's clip; default: the whole response); options of other built-in scorers are ignored.

    Returns:
        gsm8k: ``{"score": score | format_score | 0.0, "acc": exact match 1.0/0.0, "pred": extracted
        answer or ""}`` (``acc`` without format credit, ``pred`` for ``maj@N``; verl returns the bare
        score); math: the score as a float (1.0/0.0).

    Raises:
        UnknownDataSourceError: ``data_source`` has no built-in scorer (message lists the supported ones and how
            to plug in a custom function).
        UnknownRewardKwargError: a keyword is accepted by no built-in scorer.
    """
    check_reward_kwargs(kwargs)
    source = str(data_source)
    if source in GSM8K_DATA_SOURCES:
        options = {key: value for key, value in kwargs.items() if key in _GSM8K_KWARGS}
        return gsm8k.score_details(solution_str, ground_truth, **options)
    if source in MATH_DATA_SOURCES:
        return math_reward.compute_score(solution_str, ground_truth)
    raise UnknownDataSourceError(_unknown_source_message(data_source))
