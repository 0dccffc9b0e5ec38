"""``Gsm8kTool`` (verl's gsm8k_tool): every reward below is worked out by hand from verl's rules: the answer gets
``"#### "`` unless it has it, the flexible GSM8K scorer gives 1.0 for the right number and 0.0 otherwise, the
step reward is 0.0 when the score is higher than the previous submission's (0.0 before any) and -0.05 if not."""

from __future__ import annotations

import asyncio

import pytest

from verl.tools.gsm8k import NO_IMPROVEMENT_PENALTY, Gsm8kTool


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def tool() -> Gsm8kTool:
    return Gsm8kTool({"type": "native"}, None)


def submit(tool, instance, answer):
    response, step, metrics = run(tool.execute(instance, {"answer": answer}))
    return response.text, step, metrics


def test_submissions_rewards_and_replies(tool):
    instance, created = run(tool.create(ground_truth="72"))
    assert created.text is None
    # right answer first: 1.0 > 0.0 -> no penalty
    assert submit(tool, instance, "72") == ("Current parsed answer='72' reward=1.0", 0.0, {})
    # the same again: 1.0 is not higher than 1.0 -> penalty
    assert submit(tool, instance, "72") == ("Current parsed answer='72' reward=1.0", -0.05, {})
    # wrong: 0.0 -> penalty, and the final reward is the latest score
    assert submit(tool, instance, "70") == ("Current parsed answer='70' reward=0.0", -0.05, {})
    assert run(tool.calc_reward(instance)) == 0.0
    # verl compares with the previous score (0.0), so getting it right again is no longer penalised
    assert submit(tool, instance, "#### 72") == ("Current parsed answer='#### 72' reward=1.0", 0.0, {})
    assert run(tool.calc_reward(instance)) == 1.0
    assert NO_IMPROVEMENT_PENALTY == -0.05


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        ("the total is 72 apples", 1.0),  # flexible: the last number in the text
        ("72 or maybe 73", 0.0),  # ... is 73
        ("72.0", 1.0),  # core's scorer compares numbers (verl's compares strings: 0.0)
        ("$72", 1.0),
        ("", 0.0),  # "#### " alone: no number
        (72, 1.0),  # not a string: str() first (verl)
    ],
)
def test_answers_are_read_by_the_flexible_scorer(tool, answer, reward):
    instance, _ = run(tool.create(ground_truth="72"))
    text, step, _ = submit(tool, instance, answer)
    assert text == f"Current parsed answer={str(answer)!r} reward={reward}"
    assert step == (0.0 if reward > 0.0 else -0.05)
    assert run(tool.calc_reward(instance)) == reward


def test_missing_answer_scores_zero(tool):
    instance, _ = run(tool.create(ground_truth="5"))
    response, step, _ = run(tool.execute(instance, {}))
    assert (response.text, step) == ("Current parsed answer='' reward=0.0", -0.05)


def test_instances_are_independent_and_released(tool):
    a, _ = run(tool.create(ground_truth="3"))
    b, _ = run(tool.create("mine", create_kwargs={"ground_truth": "4"}))  # verl's nested form
    assert b == "mine" and a != b
    assert submit(tool, a, "4")[1:] == (-0.05, {})
    assert submit(tool, b, "4")[1:] == (0.0, {})
    assert (run(tool.calc_reward(a)), run(tool.calc_reward(b))) == (0.0, 1.0)
    run(tool.release(a))
    run(tool.release(a))  # twice is fine
    with pytest.raises(KeyError, match="unknown instance .*; call create\\(\\) first"):
        run(tool.execute(a, {"answer": "3"}))
    assert run(tool.calc_reward(b)) == 1.0


def test_create_without_ground_truth_names_the_row_field(tool):
    with pytest.raises(ValueError, match=r"tools_kwargs\.calc_gsm8k_reward\.create_kwargs\.ground_truth"):
        run(tool.create())


def test_schema_is_verls_and_arguments_are_checked(tool):
    assert tool.name == "calc_gsm8k_reward"
    assert tool.tool_schema.required == ["answer"]
    assert tool.tool_schema.check_arguments({}) == "missing required argument(s) 'answer'"
    assert tool.timeout_s == 30.0
