r"""MATH-style scorer: last ``\boxed{}`` answer, normalised and compared as strings.

Port of verl/utils/reward_score/math_reward.py (itself from EleutherAI lm-evaluation-harness hendrycks_math), with
the failure modes of known-failures K16 fixed:

* the box argument is found by real brace matching that starts at the box's own ``{`` and skips escaped braces
  (``\{``, ``\}``), so ``\boxed{\frac{1}{3}}`` yields ``\frac{1}{3}`` and never ``\frac{1``;
* ``\fbox{...}`` is unwrapped like ``\boxed{...}`` (verl raised inside ``remove_boxed`` and scored 0);
* the *last* box command of either kind wins; an unclosed last box means "no answer" (``None``, score 0);
* ``\boxed 5`` (space form) takes the first whitespace-delimited token after the command;
* normalisation never raises (verl asserted on two ``\text{ `` units and indexed past the end of ``\frac``).

Additions to verl's ``strip_string`` (each can only make two different spellings of one value equal):
``\displaystyle`` and thin spaces (``\,`` ``\;`` ``\:``) are dropped, a plain ``$`` or trailing ``%`` is dropped,
trailing sentence periods are dropped, units are only stripped when something precedes them, and plain decimals
are compared numerically in :func:`is_equiv` (``"5.0"`` == ``"5"``). An empty answer never matches.

Signs (the K14 rules of the GSM8K scorer, applied to LaTeX answers): a leading ``+`` is dropped (``+3`` == ``3``),
the Unicode minus is a minus (``−3`` == ``-3``), ``-0.5`` becomes ``-\frac{1}{2}`` as ``0.5`` becomes
``\frac{1}{2}``, and a minus inside a whole fraction moves in front (``\frac{-1}{2}`` == ``-\frac{1}{2}`` ==
``-1/2``). A sign is never dropped or added: ``-3`` never equals ``3``.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = [
    "compute_score",
    "extract_boxed_answer",
    "is_equiv",
    "last_boxed_only_string",
    "remove_boxed",
    "strip_string",
]

# "\boxed" / "\fbox" as whole commands ("\boxedx" is some other macro).
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BRACE_FORM_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_WHOLE_FRAC_RE = re.compile(r"(?P<sign>-?)\\frac\{(?P<num>[^{}]+)\}\{(?P<den>[^{}]+)\}")
_PLAIN_DECIMAL_RE = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")


def _matching_brace(string: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx``; escaped braces are skipped. None if unclosed."""
    depth = 0
    i = open_idx
    while i < len(string):
        char = string[i]
        if char == "\\":  # "\{", "\}" and "\\" are single symbols, not grouping
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed_only_string(string: str) -> str | None:
    r"""Return the last box expression including its command, e.g. ``"\boxed{2^{10}}"``.

    The last ``\boxed`` or ``\fbox`` command decides: ``\cmd{...}`` (whitespace allowed before ``{``) is cut at its
    matching brace; ``\boxed 5`` is returned as ``"\boxed 5"`` (first token after the command). Returns ``None``
    when there is no box command, when the last one is unclosed (``"\boxed{12"``) or has no argument.
    """
    last = None
    for last in _BOX_RE.finditer(string):  # noqa: B007 - only the last command counts
        pass
    if last is None:
        return None
    rest = string[last.end() :]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        open_idx = last.end() + (len(rest) - len(stripped))
        close_idx = _matching_brace(string, open_idx)
        return None if close_idx is None else string[last.start() : close_idx + 1]
    if not stripped:  # "\boxed" at the very end: no argument
        return None
    token = stripped.split("$", 1)[0].split(None, 1)
    if not token:
        return None
    answer = token[0].rstrip(".,;")
    return "\\boxed " + answer if answer else None


def remove_boxed(s: str) -> str:
    r"""Strip the box command from the output of :func:`last_boxed_only_string`: ``"\fbox{42}"`` -> ``"42"``.

    Raises:
        ValueError: ``s`` is not a single ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed x`` expression.
    """
    match = _BRACE_FORM_RE.match(s)
    if match is not None and _matching_brace(s, match.end() - 1) == len(s) - 1:
        return s[match.end() : -1]
    if s.startswith("\\boxed ") and match is None:
        return s[len("\\boxed ") :]
    raise ValueError(f"remove_boxed expects a whole '\\boxed{{...}}' expression, got {s[:80]!r}")


def extract_boxed_answer(solution_str: str) -> str | None:
    r"""Content of the last ``\boxed{}``/``\fbox{}`` in ``solution_str``, or ``None`` if there is no usable box."""
    boxed = last_boxed_only_string(solution_str)
    return None if boxed is None else remove_boxed(boxed)


def _fix_fracs(string: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{72}`` -> ``\frac{1}{72}`` (not ``\frac{72}1``)."""
    substrs = string.split("\\frac")
    new_str = substrs[0]
    for substr in substrs[1:]:
        new_str += "\\frac"
        if not substr or substr[0] == "{":
            new_str += substr
            continue
        if len(substr) < 2:
            return string
        a, b = substr[0], substr[1]
        if b != "{":
            new_str += "{" + a + "}{" + b + "}" + substr[2:]
        else:
            new_str += "{" + a + "}" + substr[1:]
    return new_str


def _fix_a_slash_b(string: str) -> str:
    r"""``"3/4"`` -> ``"\frac{3}{4}"`` when both sides are integers written canonically."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


def _fix_frac_sign(string: str) -> str:
    r"""Move the signs of a whole-answer fraction in front: ``\frac{-1}{2}``, ``\frac{1}{-2}`` -> ``-\frac{1}{2}``.

    Only a string that is exactly one (optionally negated) ``\frac{a}{b}`` with brace-free parts is touched;
    two minus signs cancel (``-\frac{-1}{2}`` -> ``\frac{1}{2}``).
    """
    match = _WHOLE_FRAC_RE.fullmatch(string)
    if match is None:
        return string
    num, den = match.group("num"), match.group("den")
    negative = (match.group("sign") == "-") ^ num.startswith("-") ^ den.startswith("-")
    num, den = num.removeprefix("-"), den.removeprefix("-")
    if not num or not den:
        return string
    return ("-" if negative else "") + "\\frac{" + num + "}{" + den + "}"


def _remove_right_units(string: str) -> str:
    r"""``"5\text{ cm}"`` -> ``"5"``; a text answer with nothing before it (``"\text{ Monday}"``) is kept."""
    for marker in ("\\text{ ", "\\mbox{ "):
        if marker in string:
            head = string.split(marker, 1)[0]
            if head.strip():
                return head
    return string


def _fix_sqrt(string: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}``."""
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if split and split[0] != "{":
            new_string += "\\sqrt{" + split[0] + "}" + split[1:]
        else:
            new_string += "\\sqrt" + split
    return new_string


def strip_string(string: str) -> str:
    r"""Normalise a LaTeX answer for string comparison (verl math_reward.strip_string, made total).

    Steps: drop line breaks, ``\!``, ``\displaystyle``, thin spaces; ``\\`` -> ``\``; ``tfrac``/``dfrac`` ->
    ``frac``; drop ``\left``/``\right``, degree marks, dollar signs, trailing units, percent signs and trailing
    periods; ``.5`` -> ``0.5`` (``-.5`` -> ``-0.5``); drop a short ``"k = "`` prefix; ``\sqrt3`` -> ``\sqrt{3}``;
    remove spaces; drop a leading ``+``; ``\frac12`` -> ``\frac{1}{2}``; ``±0.5`` -> ``±\frac{1}{2}``; ``a/b`` ->
    ``\frac{a}{b}``; the signs of a whole fraction go in front (``\frac{-1}{2}`` -> ``-\frac{1}{2}``). The
    Unicode minus (U+2212) is read as ``-``. Never raises.
    """
    string = str(string).replace("\n", "").replace("\\!", "")
    string = string.replace("\u2212", "-")  # Unicode minus sign
    string = string.replace("\\displaystyle", "")
    for thin_space in ("\\,", "\\;", "\\:"):
        string = string.replace(thin_space, "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "").replace("$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    string = string.strip()
    while string.endswith((".", "%")):
        string = string[:-1].rstrip()
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    elif string.startswith(("-.", "+.")):
        string = string[0] + "0" + string[1:]
    parts = string.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:
        string = parts[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    if len(string) > 1 and string[0] == "+":  # "+3" is 3
        string = string[1:]
    string = _fix_fracs(string)
    if string in ("0.5", "-0.5"):
        string = string[:-3] + "\\frac{1}{2}"
    return _fix_frac_sign(_fix_a_slash_b(string))


def is_equiv(str1: str | None, str2: str | None) -> bool:
    """True when two answers are equal after :func:`strip_string` (plain decimals compared numerically).

    Two ``None`` are equivalent (verl); ``None`` against a string, or an answer that normalises to ``""``, is not.
    """
    if str1 is None and str2 is None:
        return True
    if str1 is None or str2 is None:
        return False
    ss1, ss2 = strip_string(str1), strip_string(str2)
    if not ss1 or not ss2:
        return False
    if ss1 == ss2:
        return True
    if _PLAIN_DECIMAL_RE.fullmatch(ss1) and _PLAIN_DECIMAL_RE.fullmatch(ss2):
        return Decimal(ss1) == Decimal(ss2)
    return False


def compute_score(solution_str: str, ground_truth: str) -> float:
    r"""1.0 if the last ``\boxed{}`` answer in ``solution_str`` is equivalent to ``ground_truth``, else 0.0.

    ``ground_truth`` may itself be a boxed solution; its last box is used then. No box, an unclosed box or an
    empty box scores 0.0.

    Raises:
        TypeError: ``solution_str`` is not a string.
    """
    if not isinstance(solution_str, str):
        raise TypeError(f"math solution_str must be str, got {type(solution_str).__name__}")
    answer = extract_boxed_answer(solution_str)
    if answer is None:
        return 0.0
    reference = str(ground_truth)
    if _BOX_RE.search(reference):
        boxed_reference = extract_boxed_answer(reference)
        if boxed_reference is not None:
            reference = boxed_reference
    return 1.0 if is_equiv(answer, reference) else 0.0
