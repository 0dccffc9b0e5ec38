r"""MATH scorer: known-failures K16 (\boxed extraction), normalisation and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.rewards.math import (
    compute_score,
    extract_boxed_answer,
    is_equiv,
    last_boxed_only_string,
    remove_boxed,
    strip_string,
)


# --------------------------------------------------------------------------------------------------- K16
def test_k16_nested_fraction_is_not_cut_at_first_brace():
    assert extract_boxed_answer(r"... so \boxed{\frac{1}{3}}") == r"\frac{1}{3}"
    assert compute_score(r"... so \boxed{\frac{1}{3}}", r"\frac{1}{2}") == 0.0


def test_k16_nested_fraction_correct():
    assert compute_score(r"\boxed{\frac{1}{2}}", r"\frac{1}{2}") == 1.0


def test_k16_power_with_braces():
    assert extract_boxed_answer(r"The result is \boxed{2^{10}}.") == "2^{10}"
    assert compute_score(r"The result is \boxed{2^{10}}.", "2^{10}") == 1.0


def test_k16_fbox():
    assert extract_boxed_answer(r"\fbox{42}") == "42"
    assert compute_score(r"\fbox{42}", "42") == 1.0


def test_k16_unclosed_box_is_no_answer():
    assert last_boxed_only_string(r"\boxed{12") is None
    assert extract_boxed_answer(r"\boxed{12") is None
    assert compute_score(r"\boxed{12", "12") == 0.0


def test_k16_last_box_wins():
    assert extract_boxed_answer(r"\boxed{1} ... \boxed{2}") == "2"
    assert compute_score(r"\boxed{1} ... \boxed{2}", "2") == 1.0
    assert compute_score(r"\boxed{1} ... \boxed{2}", "1") == 0.0


# ---------------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{5}", "5"),
        (r"\boxed {5}", "5"),  # whitespace before the brace
        (r"$\boxed 5$", "5"),  # space form
        (r"so \boxed 12 apples.", "12"),  # space form takes one token
        (r"answer \boxed 7.", "7"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are not grouping braces
        (r"\boxed{\left\{ 3 \right.}", r"\left\{ 3 \right."),  # an unbalanced escaped brace inside
        (r"\boxed{a}\fbox{b}", "b"),  # the last command of either kind
        (r"\fbox{a} then \boxed{b}", "b"),
        (r"\boxed{\text{(A)}}", r"\text{(A)}"),
        (r"\boxed{}", ""),
        (r"\boxed{1} and \boxed{2", None),  # the last box is unclosed
        (r"\boxed", None),
        (r"no box here", None),
        (r"\boxedx{3}", None),  # another macro
        ("", None),
    ],
)
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


def test_last_boxed_only_string_keeps_command():
    assert last_boxed_only_string(r"x \boxed{2^{10}} y") == r"\boxed{2^{10}}"
    assert last_boxed_only_string(r"x \fbox{4} y") == r"\fbox{4}"


def test_remove_boxed_rejects_malformed():
    assert remove_boxed(r"\boxed{4}") == "4"
    assert remove_boxed(r"\boxed 4") == "4"
    for bad in (r"\boxed{4", "4", r"\boxed{1}{2}"):
        with pytest.raises(ValueError, match="boxed"):
            remove_boxed(bad)


# -------------------------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (r"\dfrac{1}{2}", r"\frac{1}{2}"),
        (r"\tfrac{3}{4}", r"\frac{3}{4}"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"\frac1{72}", r"\frac{1}{72}"),
        ("3/4", r"\frac{3}{4}"),
        ("0.5", r"\frac{1}{2}"),
        (".5", r"\frac{1}{2}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        (r"\$5", "5"),
        (r"50\%", "50"),
        ("50%", "50"),
        (r"5 \text{ cm}", "5"),
        (r"5\mbox{ inches}", "5"),
        (r"\text{ Monday}", r"\text{Monday}"),  # nothing precedes: a text answer, not a unit
        (r"\sqrt3", r"\sqrt{3}"),
        (r"2\sqrt2", r"2\sqrt{2}"),
        ("x = 5", "5"),
        ("k=3", "3"),
        ("5.", "5"),
        ("12.  ", "12"),
        ("1\n2", "12"),
        (r"1\!000", "1000"),
        (r"1\,000", "1000"),
        (r"\displaystyle \frac{1}{3}", r"\frac{1}{3}"),
        ("a b c", "abc"),
        ("", ""),
    ],
)
def test_strip_string(raw, expected):
    assert strip_string(raw) == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (r"\frac{1}{2}", "0.5", True),
        (r"\dfrac12", "1/2", True),
        ("5.0", "5", True),  # plain decimals compared numerically
        ("-3", "-3.00", True),
        ("3", "-3", False),
        (r"\frac{1}{3}", r"\frac{1}{2}", False),
        ("", "", False),  # an empty answer never matches
        (None, "1", False),
        (None, None, True),
        (r"\text{ A}", r"\text{ B}", False),  # must not both collapse to ""
    ],
)
def test_is_equiv(a, b, expected):
    assert is_equiv(a, b) is expected


def test_compute_score_variants():
    assert compute_score(r"Thus $\boxed{\dfrac{\sqrt{3}}{2}}$.", r"\frac{\sqrt3}{2}") == 1.0
    assert compute_score(r"\boxed{10\%}", "10") == 1.0
    assert compute_score(r"\boxed{x = 4}", "4") == 1.0
    assert compute_score("The answer is 4", "4") == 0.0  # no box
    assert compute_score(r"\boxed{}", "") == 0.0
    assert compute_score(r"\boxed{4}", r"Solution ... \boxed{4}") == 1.0  # a boxed reference is unwrapped
    assert isinstance(compute_score(r"\boxed{4}", "4"), float)
    with pytest.raises(TypeError, match="str"):
        compute_score(None, "4")


def test_multiple_text_units_do_not_raise():
    # verl asserted exactly one "\text{ " and crashed here
    assert strip_string(r"5 \text{ m} \text{ s}") == "5"


# -------------------------------------------------------------------------------------------- properties
_PIECES = [*"0123456789{}\\$ .,/=-^%abcdfrxtbox\n", r"\boxed", r"\fbox", r"\frac", r"\sqrt", r"\text{ ", r"\left"]
_LATEX = st.lists(st.sampled_from(_PIECES), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=200), _LATEX))
def test_property_never_raises(text):
    answer = extract_boxed_answer(text)
    assert answer is None or isinstance(answer, str)
    assert isinstance(strip_string(text), str)
    assert compute_score(text, "1") in (0.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(inner=st.text(alphabet="0123456789abc+-*^ ", min_size=1, max_size=20), depth=st.integers(0, 4))
def test_property_nested_braces_roundtrip(inner, depth):
    content = "{" * depth + inner + "}" * depth
    assert extract_boxed_answer(rf"prefix \boxed{{{content}}} suffix") == content


# ---------------------------------------------------------------------------------------- signs (K14 for MATH)
@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        (r"\boxed{+3}", "3", 1.0),  # a leading plus is no sign change
        ("\\boxed{\u22123}", "-3", 1.0),  # Unicode minus sign U+2212
        ("\\boxed{\u22123}", "3", 0.0),
        (r"\boxed{-0.5}", r"-\frac{1}{2}", 1.0),  # as 0.5 == \frac{1}{2}
        (r"\boxed{-.5}", r"-\frac{1}{2}", 1.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\frac{-1}{2}}", r"-\frac{1}{2}", 1.0),  # sign inside the numerator
        (r"\boxed{\frac{1}{-2}}", r"-\frac{1}{2}", 1.0),  # ... or the denominator
        (r"\boxed{-1/2}", r"-\frac{1}{2}", 1.0),
        (r"\boxed{-\dfrac12}", r"\frac{-1}{2}", 1.0),
        (r"\boxed{-\frac{-1}{2}}", r"\frac{1}{2}", 1.0),  # two minus signs cancel
        (r"\boxed{+\frac{1}{2}}", "0.5", 1.0),
        # a sign is never dropped: wrong-sign answers still score 0
        (r"\boxed{-3}", "3", 0.0),
        (r"\boxed{3}", "-3", 0.0),
        (r"\boxed{-0.5}", r"\frac{1}{2}", 0.0),
        (r"\boxed{\frac{-1}{2}}", r"\frac{1}{2}", 0.0),
        (r"\boxed{-\frac{-1}{2}}", r"-\frac{1}{2}", 0.0),
        (r"\boxed{\frac{1}{-2}}", "0.5", 0.0),
    ],
)
def test_k14_signs_in_math_answers(response, truth, expected):
    assert compute_score(response, truth) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("+3", "3"),
        ("+ 3", "3"),
        ("\u22127", "-7"),
        ("-0.5", r"-\frac{1}{2}"),
        (r"\frac{-3}{4}", r"-\frac{3}{4}"),
        (r"-\frac{3}{-4}", r"\frac{3}{4}"),
        ("-3/4", r"-\frac{3}{4}"),
        ("+", "+"),  # nothing to sign: left alone
        (r"\frac{-x}{2}+1", r"\frac{-x}{2}+1"),  # only a whole-answer fraction is rewritten
    ],
)
def test_strip_string_signs(raw, expected):
    assert strip_string(raw) == expected
