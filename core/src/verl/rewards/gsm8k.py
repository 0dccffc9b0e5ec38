"""Rule-based GSM8K scorer (verl/utils/reward_score/gsm8k.py, ReFT: Trung et al., ACL 2024).

Differences from verl's string comparison, all deliberate (known-failures K14, K15):

* answers and references are compared as **numbers** (``decimal.Decimal``; ``fractions.Fraction`` for ``a/b``),
  so ``"-3.0" == "-3"``, ``"29.00" == "29"`` and ``"1,234" == "1234"``; a non-numeric reference falls back to
  exact string comparison;
* the sign is kept (``"-3"`` never matches ``"3"``), a leading ``"+"`` is accepted, and so is the Unicode minus;
* ``"$"`` and thousands separators are accepted by the strict pattern and dropped;
* a sentence-final period is not part of the number (``"42."`` -> ``42``);
* a hyphen glued to a preceding word or digit (``"10-12"``) is a dash, not a minus sign;
* a number is read whole or not at all: it may not be followed by a digit or by ``"."``, ``","`` or ``"/"``
  plus a digit. So ``"#### 3/4"`` is the fraction 3/4 (compared exactly: it equals ``"0.75"``, never ``"3"``),
  ``"#### 1e3"`` is 1000 (an exponent is part of the number), and ``"#### 1,23"`` (an incomplete thousands
  group) is no valid number at all: strict finds no answer and scores 0;
* the strict pattern also accepts markdown emphasis after the marker (``"#### **42**"`` -> ``42``) and spaces
  between the sign and the digits (``"#### - 3"`` -> ``-3``); the flexible pattern keeps a sign only when it is
  glued to the digits, since in running text ``"5 - 3"`` is a subtraction.

The whole response is searched (the **last** answer wins), so a correct ``"#### 42"`` followed by a longer
explanation scores (verl searches only the last 300 characters and scores it 0: verl #7274). ``clip_chars=300``
restores verl's clip; an answer that straddles the clip boundary is then read whole instead of being cut in two.
Both patterns run in time linear in the text (no nested or adjacent unbounded repeats that can backtrack
over one another), so a multi-megabyte response cannot stall the reward workers.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

__all__ = ["compute_score", "extract_solution", "score_details", "check_clip_chars", "METHODS", "VERL_CLIP_CHARS"]

METHODS = ("strict", "flexible")

#: verl's clip (``_SOLUTION_CLIP_CHARS``); pass ``clip_chars=VERL_CLIP_CHARS`` to score as verl does.
VERL_CLIP_CHARS = 300
_MINUS_SIGNS = ("-", "\u2212")
# An answer ("#### $1,234" or a number) straddling the clip boundary is kept whole if it starts this close to it.
_CLIP_SLACK_CHARS = 64
_MAX_FRACTION_EXPONENT = 1000

# Thousands groups must be complete ("1,234" but not "1,23"), so "3, 4, 5" and "3,4" are separate numbers.
_INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
_EXP = r"(?:[eE][+\-]?\d+)?"
# A fraction of plain integers ("3/4", denominator not 0), a decimal with optional exponent, or ".5".
_BODY = r"\d+/0*[1-9]\d*|" + _INT + r"(?:\.\d+)?" + _EXP + r"|\.\d+" + _EXP
# A number ends where no digit follows and no ".", "," or "/" followed by a digit: "3/4", "1,23" and "1.5"
# are never read as a prefix "3", "1" or "1".
_END = r"(?!\d|[.,/]\d)"


def _number(sign_gap: str) -> str:
    """Pattern of a signed number; ``sign_gap`` is what may separate the sign from the digits."""
    # A sign counts only when it does not follow a word character or a dot ("10-12" is a range, "x-3" a difference).
    # A number never starts inside a run of digits: without that guard a long digit run that fails _END is retried
    # from each of its digits, which is quadratic in its length.
    return (
        r"(?:(?<![\w.])(?P<sign1>[+\-\u2212])" + sign_gap + r")?"
        r"(?:\$(?P<sign2>[+\-\u2212])?)?"
        r"(?<!\d)(?P<body>" + _BODY + r")" + _END
    )


# After "####": optional markdown emphasis ("#### **42**") and spaces between sign and digits ("#### - 3").
# The second run of spaces may only follow emphasis: two adjacent "\s*" would split a long run of spaces in every
# possible way before failing (quadratic).
_STRICT_RE = re.compile(r"####\s*(?:(?:\*{1,2}|_{1,2})\s*)?" + _number(r"\s*"))
# In free text a spaced sign is an operator ("5 - 3"), so the flexible pattern wants it glued to the number.
_FLEXIBLE_RE = re.compile(_number(""))
_FULL_NUMBER_RE = re.compile(r"\s*" + _number(r"\s*") + r"\s*\.?\s*")


def _last_match(pattern: re.Pattern, solution_str: str, clip_chars: int | None) -> re.Match | None:
    """Last match; with ``clip_chars``, the last one ending inside the final ``clip_chars`` (it may start earlier)."""
    window_start = 0 if clip_chars is None else max(0, len(solution_str) - clip_chars)
    last = None
    for last in pattern.finditer(solution_str, max(0, window_start - _CLIP_SLACK_CHARS)):  # noqa: B007
        pass
    return last if last is not None and last.end() > window_start else None


def _canonical(match: re.Match) -> str:
    """Signed number text without "$", "+" and thousands separators, e.g. "-1234.00"."""
    sign = match.group("sign1") or match.group("sign2") or ""
    body = match.group("body").replace(",", "")
    return ("-" if sign in _MINUS_SIGNS else "") + body


def check_clip_chars(clip_chars: object) -> None:
    """Raise ValueError unless ``clip_chars`` is None (the whole text) or a positive int of characters."""
    if clip_chars is not None and (isinstance(clip_chars, bool) or not isinstance(clip_chars, int) or clip_chars < 1):
        raise ValueError(
            f"gsm8k clip_chars={clip_chars!r} must be a positive number of characters (verl's clip: 300) or null "
            "to search the whole response (reward_kwargs.clip_chars)"
        )


def extract_solution(solution_str: str, method: str = "strict", clip_chars: int | None = None) -> str | None:
    """Extract the final numeric answer from a model response.

    Args:
        solution_str: decoded response text.
        method: ``"strict"`` takes the number after the last ``"####"`` marker (optional spaces, ``**``/``__``
            emphasis, sign and ``"$"`` allowed: ``"#### -$1,234.50"``, ``"#### **42**"``, ``"#### - 3"``);
            ``"flexible"`` takes the last number anywhere in the text.
        clip_chars: search only answers ending in the last ``clip_chars`` characters (verl: 300,
            :data:`VERL_CLIP_CHARS`); ``None`` (default) searches the whole text.

    Returns:
        The answer as canonical number text (``"-"`` kept, ``"+"``, ``"$"`` and ``","`` dropped, digits, ``"/"``
        and exponents unchanged: ``"#### $1,234.00"`` -> ``"1234.00"``, ``"#### 3/4"`` -> ``"3/4"``,
        ``"#### 1e3"`` -> ``"1e3"``), or ``None`` when no whole number is found (``"#### 1,23"``).

    Raises:
        ValueError: ``method`` is not ``"strict"`` or ``"flexible"``, or ``clip_chars`` is not a positive int.
        TypeError: ``solution_str`` is not a string.
    """
    check_clip_chars(clip_chars)
    if method not in METHODS:
        raise ValueError(f"gsm8k method={method!r} is not supported; use one of {METHODS} (reward_kwargs.method)")
    if not isinstance(solution_str, str):
        raise TypeError(f"gsm8k solution_str must be str, got {type(solution_str).__name__}")
    last = _last_match(_STRICT_RE if method == "strict" else _FLEXIBLE_RE, solution_str, clip_chars)
    return None if last is None else _canonical(last)


def _to_decimal(text: str) -> Decimal | Fraction | None:
    match = _FULL_NUMBER_RE.fullmatch(text)
    if match is not None:
        return _value(_canonical(match))
    try:  # references such as "7.2e1 " or "1E3" that the answer pattern does not cover
        value = Decimal(text.strip())
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _value(canonical: str) -> Decimal | Fraction:
    """Exact value of canonical number text: ``Fraction`` for "a/b", ``Decimal`` otherwise."""
    return Fraction(canonical) if "/" in canonical else Decimal(canonical)


def _equal(a: Decimal | Fraction, b: Decimal | Fraction) -> bool:
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b
    # A fraction against a decimal: exact rational comparison; Fraction(Decimal) is exact but expands the
    # exponent, so absurd magnitudes (no GSM8K answer) are simply unequal instead of a huge integer.
    for value in (a, b):
        if isinstance(value, Decimal) and abs(value.adjusted()) > _MAX_FRACTION_EXPONENT:
            return False
    return Fraction(a) == Fraction(b)


def _answers_match(answer: str, ground_truth: object) -> bool:
    reference = str(ground_truth).strip()
    expected = _to_decimal(reference)
    if expected is None:
        return answer == reference
    return _equal(_value(answer), expected)


def compute_score(
    solution_str: str,
    ground_truth: str | int | float,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    clip_chars: int | None = None,
) -> float:
    """Score a GSM8K response against the reference answer.

    Args:
        solution_str: decoded response text.
        ground_truth: reference answer, e.g. ``"72"`` (the part after ``"####"`` in the dataset); numbers and
            numeric strings with ``"$"``, sign, commas or decimals are compared numerically.
        method: ``"strict"`` or ``"flexible"``, see :func:`extract_solution`.
        format_score: returned when an answer was found but is wrong.
        score: returned when the answer equals the reference.
        clip_chars: ``None`` searches the whole text; ``300`` is verl's clip, see :func:`extract_solution`.

    Returns:
        ``score`` if the answer matches, ``format_score`` if an answer was found but differs, ``0.0`` if none.

    Raises:
        ValueError: unknown ``method`` or bad ``clip_chars``.  TypeError: ``solution_str`` is not a string.
    """
    return score_details(solution_str, ground_truth, method, format_score, score, clip_chars)["score"]


def score_details(
    solution_str: str,
    ground_truth: str | int | float,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    clip_chars: int | None = None,
) -> dict[str, Any]:
    """:func:`compute_score` with what it saw: ``{"score": float, "acc": 1.0 | 0.0, "pred": str}``.

    ``acc`` is the exact-match accuracy (no format credit); ``pred`` the extracted answer's value in one
    spelling (``"1,234.00"`` -> ``"1234"``; ``""`` when none was found), the vote of verl's ``maj@N``
    validation metric. Same arguments and errors as
    :func:`compute_score`.
    """
    answer = extract_solution(solution_str, method=method, clip_chars=clip_chars)
    if answer is None:
        return {"score": 0.0, "acc": 0.0, "pred": ""}
    correct = _answers_match(answer, ground_truth)
    return {"score": float(score) if correct else float(format_score), "acc": float(correct), "pred": _vote(answer)}


def _vote(answer: str) -> str:
    """One spelling per value, so "1234.00" and "1234" vote together in ``maj@N``."""
    try:
        value = _value(answer)
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return answer
    if isinstance(value, Fraction):
        return str(value)
    if abs(value.adjusted()) > _MAX_FRACTION_EXPONENT:
        return answer
    return format(value.normalize(), "f")
