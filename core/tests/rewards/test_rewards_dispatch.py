"""default_compute_score dispatch and custom reward function loading."""

from __future__ import annotations

import functools
import sys
import textwrap

import pytest

from verl.rewards import (
    SUPPORTED_DATA_SOURCES,
    RewardConfigError,
    RewardFunctionLoadError,
    UnknownDataSourceError,
    UnknownRewardKwargError,
    default_compute_score,
    load_reward_function,
)

MATH_SOURCES = ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math"]


# ---------------------------------------------------------------------------------------------- dispatch
def test_gsm8k_dispatch_and_kwargs_pass_through():
    def score(*args, **kwargs):
        return default_compute_score("openai/gsm8k", *args, **kwargs)["score"]

    assert score("#### 72", "72") == 1.0
    assert score("The answer is 72", "72") == 0.0  # strict by default
    assert score("The answer is 72", "72", method="flexible") == 1.0
    assert score("#### 71", "72", format_score=0.1) == pytest.approx(0.1)
    assert score("#### 72", "72", extra_info={"index": 3}, score=2.0) == 2.0


def test_gsm8k_reports_exact_accuracy_and_the_extracted_answer():
    # acc carries no format credit; pred is the vote of maj@N ("" when no answer was found).
    assert default_compute_score("openai/gsm8k", "#### 71", "72", format_score=0.1) == {
        "score": pytest.approx(0.1),
        "acc": 0.0,
        "pred": "71",
    }
    assert default_compute_score("openai/gsm8k", "#### $1,234.00", "1234") == {"score": 1.0, "acc": 1.0, "pred": "1234"}
    assert default_compute_score("openai/gsm8k", "no answer", "1") == {"score": 0.0, "acc": 0.0, "pred": ""}


@pytest.mark.parametrize("source", MATH_SOURCES)
def test_math_dispatch(source):
    assert default_compute_score(source, r"so \boxed{\frac{1}{2}}", r"\frac12") == 1.0
    assert default_compute_score(source, r"so \boxed{\frac{1}{3}}", r"\frac12") == 0.0


def test_gsm8k_only_kwargs_are_ignored_for_math():
    # one reward_kwargs must serve a dataset that mixes GSM8K and MATH rows
    assert default_compute_score("math", r"\boxed{4}", "4", method="flexible", format_score=0.1) == 1.0


def test_numpy_string_data_source():
    np = pytest.importorskip("numpy")
    assert default_compute_score(np.str_("openai/gsm8k"), "#### 1", "1")["score"] == 1.0


def test_unknown_data_source_error_lists_sources_and_custom_path():
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("my/dataset", "x", "y")
    message = str(info.value)
    assert "'my/dataset'" in message
    for source in SUPPORTED_DATA_SOURCES:
        assert source in message
    assert "custom_reward_function.path" in message
    assert isinstance(info.value, ValueError)


def test_unknown_kwarg_and_bad_method_are_config_errors():
    with pytest.raises(UnknownRewardKwargError, match="metod") as info:
        default_compute_score("openai/gsm8k", "#### 1", "1", metod="flexible")
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(RewardConfigError, match="'loose'"):
        default_compute_score("openai/gsm8k", "#### 1", "1", method="loose")


def test_supported_sources_exact():
    assert set(SUPPORTED_DATA_SOURCES) == {"openai/gsm8k", *MATH_SOURCES}


# ------------------------------------------------------------------------------------------- custom loading
def _write(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_load_default_name(tmp_path):
    path = _write(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str == ground_truth)
        """,
    )
    fn = load_reward_function(path)
    assert fn(data_source="d", solution_str="a", ground_truth="a", extra_info=None) == 1.0
    assert fn(data_source="d", solution_str="a", ground_truth="b", extra_info=None) == 0.0
    assert fn.__module__ in sys.modules  # importable by name, like a normal module


def test_load_named_function_with_bound_kwargs(tmp_path):
    path = _write(
        tmp_path,
        """
        def length_reward(data_source, solution_str, ground_truth, extra_info=None, scale=1.0, **kwargs):
            return {"score": scale * len(solution_str), "length": len(solution_str)}
        """,
    )
    fn = load_reward_function(str(path), name="length_reward", reward_kwargs={"scale": 0.5})
    assert isinstance(fn, functools.partial) and fn.keywords == {"scale": 0.5}
    assert fn(data_source="d", solution_str="abcd", ground_truth="", extra_info={}) == {"score": 2.0, "length": 4}


def test_no_reward_kwargs_returns_plain_function(tmp_path):
    path = _write(tmp_path, "def compute_score(**kwargs):\n    return 0.0\n")
    fn = load_reward_function(path, reward_kwargs={})
    assert not isinstance(fn, functools.partial)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(RewardFunctionLoadError, match="nope.py.*does not exist"):
        load_reward_function(missing)


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(RewardFunctionLoadError, match="not a file"):
        load_reward_function(tmp_path)


def test_missing_function_lists_candidates(tmp_path):
    path = _write(tmp_path, "def score_a(**kw):\n    return 0.0\n\ndef _private(**kw):\n    return 0.0\n")
    with pytest.raises(RewardFunctionLoadError) as info:
        load_reward_function(path, name="compute_score")
    message = str(info.value)
    assert "'compute_score'" in message and "my_reward.py" in message and "score_a" in message
    assert "_private" not in message


def test_not_callable(tmp_path):
    path = _write(tmp_path, "compute_score = 3\n")
    with pytest.raises(RewardFunctionLoadError, match="compute_score.*my_reward.py.*int, not a function"):
        load_reward_function(path)


@pytest.mark.parametrize(
    "signature",
    [
        "def compute_score(solution_str, ground_truth):",  # missing data_source / extra_info
        "def compute_score(data_source, solution_str, answer, extra_info=None):",  # wrong name
        "def compute_score(data_source, solution_str, ground_truth, extra_info, required_option):",
    ],
)
def test_bad_signature(tmp_path, signature):
    path = _write(tmp_path, f"{signature}\n    return 0.0\n")
    with pytest.raises(RewardFunctionLoadError) as info:
        load_reward_function(path)
    message = str(info.value)
    assert "compute_score" in message and "my_reward.py" in message and "extra_info" in message


def test_reward_kwargs_not_accepted(tmp_path):
    path = _write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    pass\n")
    with pytest.raises(RewardFunctionLoadError, match="reward_kwargs.*scale"):
        load_reward_function(path, reward_kwargs={"scale": 2.0})


def test_import_error_is_wrapped(tmp_path):
    path = _write(tmp_path, "import not_a_real_module_xyz\n")
    with pytest.raises(RewardFunctionLoadError, match="my_reward.py.*ModuleNotFoundError") as info:
        load_reward_function(path)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_two_files_with_same_stem_do_not_collide(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fa = load_reward_function(_write(tmp_path / "a", "def compute_score(**kw):\n    return 1.0\n", "r.py"))
    fb = load_reward_function(_write(tmp_path / "b", "def compute_score(**kw):\n    return 2.0\n", "r.py"))
    assert fa() == 1.0 and fb() == 2.0
