"""GSM8K scorer: known-failures K14 (signs) and K15 (formatting), plus extra formats and properties."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.rewards.gsm8k import METHODS, VERL_CLIP_CHARS, compute_score, extract_solution


def _gsm8k_dir() -> Path:
    # The copy shipped inside verl-core (package data), so the test runs wherever the package is installed.
    from verl.data.gsm8k import default_source_dir

    return default_source_dir()


# --------------------------------------------------------------------------------------------------- K14
@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("Let me compute. 5 - 8 = -3 #### -3", "-3", 1.0),  # (a)
        ("#### 3", "-3", 0.0),  # (b) wrong sign never matches
        ("#### +7", "7", 1.0),  # (c)
        ("#### -3.0", "-3", 1.0),  # (d) compared as numbers
        ("#### -3", "3", 0.0),  # sign is not stripped from the answer either
        ("#### \u22123", "-3", 1.0),  # Unicode minus sign
        ("#### -$3", "-3", 1.0),
        ("#### $-3", "-3", 1.0),
    ],
)
def test_k14_signs(response, truth, expected):
    assert compute_score(response, truth) == expected


def test_k14_flexible_keeps_sign():
    assert compute_score("the temperature drops to -12 degrees", "-12", method="flexible") == 1.0
    assert compute_score("the temperature drops to -12 degrees", "12", method="flexible") == 0.0


# --------------------------------------------------------------------------------------------------- K15
@pytest.mark.parametrize(
    ("response", "truth", "method", "expected"),
    [
        ("The answer is $1,234.00", "1234", "flexible", 1.0),  # known wrong parse: 234.0
        ("#### 1,234", "1234", "strict", 1.0),
        ("#### $1,234", "1234", "strict", 1.0),
        ("#### 29.00", "29", "strict", 1.0),
        ("The answer is 42.", "42", "flexible", 1.0),  # sentence-final period is not part of the number
        ("The answer is 1234", "1234", "strict", 0.0),  # no "####": strict finds nothing
        ("First 7 then 1234 in the end", "1234", "flexible", 1.0),  # flexible: last number
        ("First 1234 then 7 in the end", "1234", "flexible", 0.0),
    ],
)
def test_k15_formatting(response, truth, method, expected):
    assert compute_score(response, truth, method=method) == expected


def test_k15_strict_without_marker_scores_zero_even_with_format_score():
    # no answer found -> 0, not format_score
    assert compute_score("The answer is 1234", "1234", method="strict", format_score=0.1) == 0.0


# --------------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    ("text", "method", "expected"),
    [
        ("#### 72", "strict", "72"),
        ("####72", "strict", "72"),
        ("####   72 apples", "strict", "72"),
        ("#### $1,234.50", "strict", "1234.50"),
        ("#### 1,234,567", "strict", "1234567"),
        ("#### 0.5", "strict", "0.5"),
        ("#### .5", "strict", ".5"),
        ("#### 18.", "strict", "18"),
        ("#### 1 #### 2", "strict", "2"),  # the last marker wins
        ("#### abc", "strict", None),
        ("####", "strict", None),
        ("", "strict", None),
        ("no digits here", "flexible", None),
        ("pages 10-12", "flexible", "12"),  # a dash between numbers is not a minus sign
        ("x-3 is small", "flexible", "3"),
        ("we get 3, 4, 5.", "flexible", "5"),  # list commas are not thousands separators
        ("about 3,4", "flexible", "4"),
        ("sum is 1,2345", "flexible", "2345"),  # incomplete thousands group
        ("$5-3", "flexible", "3"),
        ("cost: $12.50.", "flexible", "12.50"),
        ("it is 50%", "flexible", "50"),
        ("#### 7\nThe answer: 9", "flexible", "9"),
    ],
)
def test_extract_solution(text, method, expected):
    assert extract_solution(text, method=method) == expected


def test_answer_before_a_long_explanation_is_found():
    # verl #7274: verl clips to the last 300 characters, so this correct answer scores 0 there
    text = "Step 1 ... so the total is 42.\n#### 42\n" + "Explanation: we added the two numbers. " * 20
    assert len(text) > 700
    assert extract_solution(text, "strict") == "42"
    assert compute_score(text, "42") == 1.0
    assert compute_score(text, "42", clip_chars=VERL_CLIP_CHARS) == 0.0
    # the last answer still wins when there are several
    assert extract_solution("#### 5\n" + "x" * 1000 + "\n#### 7", "strict") == "7"


def test_verl_clip_option_searches_only_the_last_300_chars():
    assert extract_solution("#### 5" + " filler" * 60, "strict", clip_chars=300) is None
    assert extract_solution("#### 5" + " filler" * 60, "strict") == "5"
    assert extract_solution("x" * 1000 + "#### 5", "strict", clip_chars=300) == "5"
    with pytest.raises(ValueError, match="clip_chars"):
        extract_solution("#### 5", "strict", clip_chars=0)


def test_clip_never_cuts_a_number_in_two():
    # the number straddles the 300-char boundary: its leading digits must not be lost
    text = "#### 123456789" + "." + " " * 298
    assert len(text) - 300 < text.index("1") + 9
    assert extract_solution(text, "strict", clip_chars=300) == "123456789"
    assert extract_solution("1,234,567" + "z" * 295, "flexible", clip_chars=300) == "1234567"
    # the "####" marker itself straddles the boundary (the window starts at its fourth "#")
    assert extract_solution("#### 72" + " " * 296, "strict", clip_chars=300) == "72"


@pytest.mark.parametrize(
    "text",
    [
        "1" * 200_000 + "/0",  # a digit run that fails the number's end, retried from every digit if unguarded
        "#### " + " " * 200_000 + "x",  # adjacent unbounded space runs after the marker
        "#### -" + " " * 200_000 + "x",
        ("#### " + " " * 50) * 4_000,
        "1," * 100_000 + "2",
    ],
)
def test_long_adversarial_text_is_scanned_in_linear_time(text):
    # Quadratic backtracking on these 200k-character inputs takes minutes; linear scanning well under a second.
    # The bound is generous (a shared CI core) and still three orders of magnitude below the quadratic case.
    import time

    start = time.perf_counter()
    for method in METHODS:
        extract_solution(text, method)
    assert time.perf_counter() - start < 5.0


def test_format_score_and_score_values():
    assert compute_score("#### 5", "6", format_score=0.1) == pytest.approx(0.1)
    assert compute_score("#### 6", "6", score=2.0) == 2.0
    assert compute_score("nothing", "6", format_score=0.1, method="flexible") == 0.0
    assert isinstance(compute_score("nothing", "6"), float)


@pytest.mark.parametrize(
    ("truth", "expected"),
    [(72, 1.0), (72.0, 1.0), ("72", 1.0), (" 72 ", 1.0), ("$72", 1.0), ("72.000", 1.0), ("7.2e1", 1.0), ("73", 0.0)],
)
def test_ground_truth_forms(truth, expected):
    assert compute_score("#### 72", truth) == expected


def test_non_numeric_ground_truth_falls_back_to_string_equality():
    assert compute_score("#### 5", "five") == 0.0
    assert compute_score("#### 5", "nan") == 0.0  # "nan" is not a finite reference number


def test_invalid_method_and_type():
    with pytest.raises(ValueError, match="strict"):
        extract_solution("#### 5", method="loose")
    with pytest.raises(TypeError, match="str"):
        compute_score(None, "5")


def test_dataset_answers_score_one_against_their_own_reference():
    # Every reference solution in the shipped data must score 1.0 in strict mode against its own final answer.
    rows = []
    for path in sorted(_gsm8k_dir().glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            rows.extend(json.loads(line) for _, line in zip(range(300), f, strict=False))
    assert len(rows) == 600  # 300 from each split
    for row in rows:
        truth = row["answer"].split("####")[-1].strip().replace(",", "")
        assert compute_score(row["answer"], truth) == 1.0, row["answer"][-80:]


# -------------------------------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None)
@given(value=st.integers(min_value=-(10**9), max_value=10**9), commas=st.booleans(), dollar=st.booleans())
def test_property_integer_roundtrip(value, commas, dollar):
    body = f"{abs(value):,}" if commas else str(abs(value))
    text = ("-" if value < 0 else "") + ("$" if dollar else "") + body
    assert compute_score(f"Reasoning...\n#### {text}", str(value)) == 1.0
    assert compute_score(f"So the answer is {text}.", str(value), method="flexible") == 1.0
    assert compute_score(f"#### {text}", str(value + 1)) == 0.0


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400))
def test_property_never_raises_on_arbitrary_text(text):
    for method in ("strict", "flexible"):
        answer = extract_solution(text, method=method)
        assert answer is None or isinstance(answer, str)
        assert compute_score(text, "12", method=method) in (0.0, 1.0)


# ----------------------------------------------------------------------------------- whole numbers only
@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("#### 3/4", "3/4"),  # a fraction, never its numerator
        ("#### -3/4", "-3/4"),
        ("#### 1e3", "1e3"),  # an exponent is part of the number
        ("#### 2.5E-1", "2.5E-1"),
        ("#### 1,23", None),  # incomplete thousands group: no valid number, never "1"
        ("#### 1,234,5", None),
        ("#### 3/0", None),  # a zero denominator is no number
        ("#### 1.5.3", None),
        ("#### **42**", "42"),  # markdown bold
        ("#### *42*", "42"),
        ("#### __42__", "42"),
        ("#### - 3", "-3"),  # a spaced sign after the marker
        ("#### + 7", "7"),
        ("#### 5 eggs", "5"),
        ("#### 7.", "7"),
    ],
)
def test_strict_reads_whole_numbers(response, answer):
    assert extract_solution(response, "strict") == answer


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("#### 3/4", "3", 0.0),  # the partial read "3" was a false positive
        ("#### 3/4", "0.75", 1.0),  # 3/4 is compared as the exact rational 0.75
        ("#### 3/4", "3/4", 1.0),
        ("#### 6/8", "0.75", 1.0),
        ("#### 1/3", "0.333", 0.0),  # exact: no rounding
        ("#### -3/4", "-0.75", 1.0),
        ("#### 1e3", "1", 0.0),  # the partial read "1" was a false positive
        ("#### 1e3", "1000", 1.0),
        ("#### 1e3", "1,000", 1.0),
        ("#### 1,23", "1", 0.0),  # the partial read "1" was a false positive
        ("#### 1,23", "123", 0.0),  # not a number either way
        ("#### **42**", "42", 1.0),
        ("#### - 3", "-3", 1.0),
        ("#### - 3", "3", 0.0),
        ("#### 1e999999", "0.5", 0.0),  # absurd magnitudes compare cheaply and unequal
        ("#### 1/2", "1e999999", 0.0),
    ],
)
def test_strict_number_boundary_scores(response, truth, expected):
    assert compute_score(response, truth) == expected


def test_flexible_keeps_a_spaced_minus_as_an_operator():
    # In running text "5 - 3" is a subtraction: the last number is 3, not -3.
    assert extract_solution("so x = 5 - 3", "flexible") == "3"
    assert extract_solution("she ate 3/4 of it", "flexible") == "3/4"


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "300"])
def test_clip_chars_must_be_a_positive_int_at_config_time(bad):
    from verl.rewards.default import check_reward_kwargs
    from verl.rewards.errors import RewardConfigError

    with pytest.raises(RewardConfigError, match=r"clip_chars=.*reward_kwargs\.clip_chars"):
        check_reward_kwargs({"clip_chars": bad})
    check_reward_kwargs({"clip_chars": VERL_CLIP_CHARS})
    check_reward_kwargs({"clip_chars": None})
