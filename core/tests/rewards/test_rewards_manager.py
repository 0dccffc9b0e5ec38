"""RewardManager: decoding, placement at the last valid token (anatomy §14.2), error policies, timeouts."""

from __future__ import annotations

import asyncio
import logging
import math
import pickle
import threading
import time

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rewards import (
    AllRewardsFailedError,
    RewardConfigError,
    RewardFunctionError,
    RewardInputError,
    RewardManager,
    UnknownDataSourceError,
    load_reward_function,
)

PAD, EOS = 0, 1


class CharTokenizer:
    """id -> chr(id); 0 (pad) and 1 (eos) are special tokens. Records every decode call."""

    def __init__(self):
        self.calls = []

    def decode(self, ids, skip_special_tokens=False):
        self.calls.append((list(ids), skip_special_tokens))
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i in (PAD, EOS)))


def encode(text):
    return [ord(c) for c in text]


def make_batch(responses, data_sources, truths, prompt_len=4, resp_len=10, extra_info=None, eos=True):
    """verl layout: prompt left-padded to prompt_len, response right-padded to resp_len (+ EOS when it fits).

    An empty text gives a response with no valid token at all (not even EOS)."""
    bs = len(responses)
    prompts = torch.full((bs, prompt_len), PAD, dtype=torch.long)
    resp = torch.full((bs, resp_len), PAD, dtype=torch.long)
    attention = torch.zeros((bs, prompt_len + resp_len), dtype=torch.long)
    for i, text in enumerate(responses):
        prompt = encode("Q?")
        prompts[i, prompt_len - len(prompt) :] = torch.tensor(prompt)
        attention[i, prompt_len - len(prompt) : prompt_len] = 1
        ids = encode(text) + ([EOS] if eos and 0 < len(text) < resp_len else [])
        ids = ids[:resp_len]
        if ids:
            resp[i, : len(ids)] = torch.tensor(ids)
            attention[i, prompt_len : prompt_len + len(ids)] = 1
    non_tensors = {
        "data_source": np.array(data_sources, dtype=object),
        "reward_model": np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object),
    }
    if extra_info is not None:
        non_tensors["extra_info"] = np.array(extra_info, dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": resp,
            "attention_mask": attention,
            "response_mask": attention[:, prompt_len:],
        },
        non_tensors=non_tensors,
    )


# ------------------------------------------------------------------------------------------- placement
def test_placement_at_last_valid_token_hand_computed():
    # row 0: "#### 72" + EOS -> 8 valid tokens -> index 7, correct (1.0)
    # row 1: "#### 3" + EOS -> 7 valid tokens -> index 6, wrong sign vs "-3" (0.0)
    # row 2: "#### -3" + EOS -> 8 valid tokens -> index 7, correct (1.0)
    # row 3: empty response -> no token, nothing placed
    data = make_batch(["#### 72", "#### 3", "#### -3", ""], ["openai/gsm8k"] * 4, ["72", "-3", "-3", "1"])
    out = RewardManager(CharTokenizer())(data, return_dict=True)
    expected = torch.zeros(4, 10)
    expected[0, 7] = 1.0
    expected[2, 7] = 1.0
    assert out["reward_tensor"].dtype == torch.float32
    assert torch.equal(out["reward_tensor"], expected)
    assert out["metrics"] == {
        "reward/errors": 0,
        "reward/timeouts": 0,
        "reward/invalid": 0,
        "reward/crashes": 0,
        "reward/empty_responses": 1,
    }
    # The gsm8k scorer reports its score, exact-match accuracy and the extracted answer (maj@N's vote).
    assert out["reward_extra_info"] == {
        "score": [1.0, 0.0, 1.0, 0.0],
        "acc": [1.0, 0.0, 1.0, 0.0],
        "pred": ["72", "3", "-3", ""],
    }


def test_nonzero_score_placement_and_sum_equals_score():
    data = make_batch(["ab", "abcdef", "abcdefghij"], ["s"] * 3, ["", "", ""])  # last one fills resp_len: no EOS

    def length_score(data_source, solution_str, ground_truth, extra_info=None):
        return len(solution_str) + 0.5

    tensor = RewardManager(CharTokenizer(), compute_score=length_score)(data)
    # valid lengths 3, 7, 10 -> indices 2, 6, 9; EOS is skipped when decoding so the text lengths are 2, 6, 10
    expected = torch.zeros(3, 10)
    expected[0, 2], expected[1, 6], expected[2, 9] = 2.5, 6.5, 10.5
    assert torch.equal(tensor, expected)
    assert torch.equal(tensor.sum(-1), torch.tensor([2.5, 6.5, 10.5]))


def test_decode_gets_only_valid_ids_with_skip_special_tokens():
    tok = CharTokenizer()
    data = make_batch(["hi", ""], ["s", "s"], ["", ""])
    RewardManager(tok, compute_score=lambda **kw: 0.0)(data)
    assert tok.calls == [([ord("h"), ord("i"), EOS], True), ([], True)]


def test_response_mask_only_with_observation_tokens():
    # multi-turn: tokens 3-4 are tool output (mask 0) but are real text; the last generated token is index 6
    responses = torch.tensor([[104, 105, 32, 91, 93, 33, EOS, PAD], [104, EOS, PAD, PAD, PAD, PAD, PAD, PAD]])
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0, 0]])
    data = DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": np.array(["s", "s"], dtype=object),
            "reward_model": np.array([{"ground_truth": "hi []!"}, {"ground_truth": "h"}], dtype=object),
        },
    )
    seen = []

    def exact(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(solution_str)
        return float(solution_str == ground_truth)

    tensor = RewardManager(CharTokenizer(), compute_score=exact, num_workers=1, timeout_s=None)(data)
    assert sorted(seen) == ["h", "hi []!"]
    expected = torch.zeros(2, 8)
    expected[0, 6], expected[1, 1] = 1.0, 1.0
    assert torch.equal(tensor, expected)


def test_attention_mask_without_response_mask():
    data = make_batch(["#### 5"], ["openai/gsm8k"], ["5"])
    data.pop(batch_keys=["response_mask"])
    tensor = RewardManager(CharTokenizer())(data)
    assert tensor[0, 6].item() == 1.0 and tensor.sum().item() == 1.0


# ------------------------------------------------------------------------------------------- scorers
def test_reward_kwargs_are_passed_to_every_call():
    data = make_batch(["The answer is 72", "so 8"], ["openai/gsm8k"] * 2, ["72", "9"], resp_len=24)
    strict = RewardManager(CharTokenizer())(data)
    flexible = RewardManager(CharTokenizer(), reward_kwargs={"method": "flexible", "format_score": 0.25})(data)
    assert strict.sum().item() == 0.0
    assert flexible[0, 16].item() == 1.0 and flexible[1, 4].item() == 0.25


def test_math_source_through_default_scorer():
    data = make_batch(
        [r"\boxed{\frac{1}{3}}", r"\fbox{42}"], ["HuggingFaceH4/MATH-500", "math"], [r"\frac12", "42"], resp_len=24
    )
    out = RewardManager(CharTokenizer())(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 1.0]


def test_dict_results_feed_reward_extra_info():
    data = make_batch(["a", "bb", "ccc"], ["s"] * 3, ["1", "2", "3"])

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "bb":
            return 0.5
        return {"score": float(len(solution_str)), "pred": solution_str, "acc": len(solution_str) == 3}

    out = RewardManager(CharTokenizer(), compute_score=scorer)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.5, 3.0]
    info = out["reward_extra_info"]
    assert info["score"] == [1.0, None, 3.0]
    assert info["pred"] == ["a", None, "ccc"]
    assert info["acc"] == [False, 0.5, True]
    assert all(len(v) == 3 for v in info.values())


def test_extra_info_is_passed_as_a_copy():
    extra = [{"index": 0}, {"index": 1}]
    data = make_batch(["x", "y"], ["s", "s"], ["", ""], extra_info=extra)
    seen = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        seen.append(extra_info["index"])
        extra_info["mutated"] = True
        return 0.0

    RewardManager(CharTokenizer(), compute_score=scorer)(data)
    assert sorted(seen) == [0, 1]
    assert all("mutated" not in e for e in data.non_tensor_batch["extra_info"])


def test_missing_extra_info_column_gives_empty_dict():
    data = make_batch(["x"], ["s"], [""])
    seen = []
    RewardManager(CharTokenizer(), compute_score=lambda **kw: seen.append(kw["extra_info"]) or 0.0)(data)
    assert seen == [{}]


def test_async_scorer():
    async def scorer(data_source, solution_str, ground_truth, extra_info=None):
        await asyncio.sleep(0)
        return 2.0

    data = make_batch(["x", "yy"], ["s", "s"], ["", ""])
    assert RewardManager(CharTokenizer(), compute_score=scorer)(data).sum().item() == 4.0


def test_custom_function_from_file(tmp_path):
    path = tmp_path / "rw.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    return {'score': float(solution_str == ground_truth) + bonus, 'len': len(solution_str)}\n"
    )
    fn = load_reward_function(path, reward_kwargs={"bonus": 0.5})
    data = make_batch(["yes", "no"], ["my/data", "my/data"], ["yes", "yes"])
    out = RewardManager(CharTokenizer(), compute_score=fn)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.5, 0.5]
    assert out["reward_extra_info"]["len"] == [3, 2]


# ------------------------------------------------------------------------------------------- failures
def _bad_value(kind):
    return {
        "nan": math.nan,
        "inf": -math.inf,
        "none": None,
        "str": "1.0",
        "list": [1.0],
        "no_score": {"acc": 1.0},
        "nan_score": {"score": math.nan},
        "tensor2": torch.tensor([1.0, 2.0]),
    }[kind]


BAD_KINDS = ["nan", "inf", "none", "str", "list", "no_score", "nan_score", "tensor2"]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_invalid_results_are_zeroed_and_counted(kind):
    data = make_batch(["good", "bad", "good"], ["s"] * 3, ["", "", ""])

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return _bad_value(kind) if solution_str == "bad" else 1.0

    out = RewardManager(CharTokenizer(), compute_score=scorer)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert out["metrics"]["reward/errors"] == 1 and out["metrics"]["reward/timeouts"] == 0
    assert out["reward_extra_info"]["acc"] == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_invalid_results_raise_under_fail_policy(kind):
    data = make_batch(["good", "bad"], ["src/a", "src/b"], ["", ""])

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return _bad_value(kind) if solution_str == "bad" else 1.0

    with pytest.raises(RewardFunctionError) as info:
        RewardManager(CharTokenizer(), compute_score=scorer, on_error="fail")(data)
    assert info.value.index == 1 and info.value.data_source == "src/b" and info.value.kind == "invalid_result"
    assert "sample 1" in str(info.value) and "'src/b'" in str(info.value)


def test_numeric_types_accepted():
    values = iter([np.float32(0.5), np.int64(2), torch.tensor(0.25), 1, True])
    data = make_batch(["a"] * 5, ["s"] * 5, [""] * 5)
    lock = threading.Lock()

    def scorer(**kwargs):
        with lock:
            return next(values)

    out = RewardManager(CharTokenizer(), compute_score=scorer, num_workers=1, timeout_s=None)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [0.5, 2.0, 0.25, 1.0, 1.0]
    assert out["metrics"]["reward/errors"] == 0


def test_exception_zero_policy_logs_once_per_call(caplog):
    data = make_batch(["a", "b", "c", "d"], ["s"] * 4, [""] * 4)

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str in ("b", "d"):
            raise KeyError("missing field 'x'")
        return 1.0

    manager = RewardManager(CharTokenizer(), compute_score=scorer)
    with caplog.at_level(logging.WARNING, logger="verl.rewards.manager"):
        out = manager(data, return_dict=True)
        manager(data)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out["metrics"]["reward/errors"] == 2
    assert manager.last_metrics["reward/errors"] == 2
    # One warning per kind of failure per call (= per training step), naming the first failing sample (index 1).
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert all("reward sample 1 " in w and "KeyError" in w for w in warnings)


def test_exception_fail_policy_names_sample_and_chains_cause():
    data = make_batch(["a", "b"], ["src/a", "src/b"], ["", ""])

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "b":
            raise ZeroDivisionError("division by zero")
        return 1.0

    with pytest.raises(RewardFunctionError, match=r"sample 1 .*'src/b'.*ZeroDivisionError") as info:
        RewardManager(CharTokenizer(), compute_score=scorer, on_error="fail")(data)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.kind == "exception"


def _raise_on_b(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("b"):
        raise ZeroDivisionError(f"cannot score {solution_str!r}")
    return 1.0


def test_all_failed_stops_under_zero_policy_naming_function_and_first_error():
    data = make_batch(["a", "b1", "b2"], ["src/a", "src/b", "src/c"], ["", "", ""])
    manager = RewardManager(CharTokenizer(), compute_score=_raise_on_b)
    assert manager(data, return_dict=True)["metrics"]["reward/errors"] == 2  # 2 of 3 failed: scored and counted
    with pytest.raises(AllRewardsFailedError) as info:
        manager(make_batch(["b1", "b2"], ["src/b", "src/c"], ["", ""]))
    err = info.value
    assert isinstance(err, RewardFunctionError) and isinstance(err.__cause__, ZeroDivisionError)
    assert (err.samples, err.index, err.data_source, err.kind) == (2, 0, "src/b", "exception")
    text = str(err)
    for part in (
        "all 2 samples",
        f"{__name__}._raise_on_b",  # the reward function, by module and name
        "sample 0 (data_source='src/b')",
        "ZeroDivisionError: cannot score 'b1'",  # the first exception: type and message
        "reward_model.stop_on_all_failed=false",
    ):
        assert part in text, (part, text)
    err.context = "training step 7"
    assert "all 2 samples of training step 7 failed" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.context == "training step 7"


def test_all_failed_tolerated_when_asked():
    data = make_batch(["b1", "b2"], ["s", "s"], ["", ""])
    out = RewardManager(CharTokenizer(), compute_score=_raise_on_b, stop_on_all_failed=False)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 0.0]
    assert out["metrics"]["reward/errors"] == 2


def test_all_failed_counts_timeouts_and_invalid_results_too():
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            time.sleep(0.5)
        return float("nan")

    data = make_batch(["nan", "slow"], ["s", "s"], ["", ""])
    with pytest.raises(AllRewardsFailedError, match="sample 0 .*invalid_result: .*result is nan"):
        RewardManager(CharTokenizer(), compute_score=scorer, timeout_s=0.2)(data)


def test_all_failed_names_the_builtin_scorers():
    def broken(**kwargs):
        raise RuntimeError("boom")

    manager = RewardManager(CharTokenizer())
    assert manager.scorer_name.startswith("default_compute_score (the built-in scorers")
    assert RewardManager(CharTokenizer(), compute_score=broken).scorer_name.endswith("broken")


def test_config_errors_raise_under_zero_policy():
    data = make_batch(["#### 1"], ["unknown/source"], ["1"])
    with pytest.raises(UnknownDataSourceError, match="unknown/source"):
        RewardManager(CharTokenizer())(data)

    def scorer(**kwargs):
        raise RewardConfigError("bad option")

    with pytest.raises(RewardConfigError, match="bad option"):
        RewardManager(CharTokenizer(), compute_score=scorer)(make_batch(["x"], ["s"], [""]))


# ------------------------------------------------------------------------------------------- timeouts
def test_timeout_zero_policy():
    release = threading.Event()

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            release.wait(5.0)  # longer than timeout_s; released at the end so the thread exits
        return 1.0

    data = make_batch(["a", "slow", "b"], ["s"] * 3, ["", "", ""])
    start = time.monotonic()
    try:
        out = RewardManager(CharTokenizer(), compute_score=scorer, timeout_s=0.2)(data, return_dict=True)
    finally:
        release.set()
    elapsed = time.monotonic() - start
    assert 0.2 <= elapsed < 2.0
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0]
    assert out["metrics"] == {
        "reward/errors": 1,
        "reward/timeouts": 1,
        "reward/invalid": 0,
        "reward/crashes": 0,
        "reward/empty_responses": 0,
    }


def test_hung_scorers_do_not_block_the_rest_with_one_worker():
    release = threading.Event()

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str.startswith("hang"):
            release.wait(5.0)
        return 1.0

    data = make_batch(["hang1", "a", "hang2", "b", "c"], ["s"] * 5, [""] * 5)
    start = time.monotonic()
    try:
        out = RewardManager(CharTokenizer(), compute_score=scorer, timeout_s=0.2, num_workers=1)(data, return_dict=True)
    finally:
        release.set()
    assert time.monotonic() - start < 2.0  # two sequential timeouts (~0.4 s), replacement threads go on
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert out["metrics"]["reward/timeouts"] == 2 and out["metrics"]["reward/errors"] == 2


def test_timeout_fail_policy():
    release = threading.Event()

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            release.wait(5.0)
        return 1.0

    data = make_batch(["a", "slow"], ["s", "src/slow"], ["", ""])
    try:
        with pytest.raises(RewardFunctionError, match=r"sample 1 .*'src/slow'.*timeout") as info:
            RewardManager(CharTokenizer(), compute_score=scorer, timeout_s=0.2, on_error="fail")(data)
    finally:
        release.set()
    assert info.value.kind == "timeout"


def test_slow_scorers_overlap():
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(0.1)
        return 1.0

    data = make_batch(["x"] * 8, ["s"] * 8, [""] * 8)
    start = time.monotonic()
    tensor = RewardManager(CharTokenizer(), compute_score=scorer, num_workers=8)(data)
    assert time.monotonic() - start < 0.5  # sequential would take 0.8 s
    assert tensor.sum().item() == 8.0


def test_gsm8k_fast_path_takes_milliseconds():
    data = make_batch(["Reasoning... #### 72"] * 32, ["openai/gsm8k"] * 32, ["72"] * 32, resp_len=32)
    manager = RewardManager(CharTokenizer())
    manager(data)  # warm-up
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        tensor = manager(data)
        timings.append(time.perf_counter() - start)
    assert tensor.sum().item() == 32.0
    assert sorted(timings)[2] < 0.05, timings


# ------------------------------------------------------------------------------------------- inputs
def test_missing_inputs():
    manager = RewardManager(CharTokenizer(), compute_score=lambda **kw: 0.0)
    data = make_batch(["a"], ["s"], [""])
    data.pop(non_tensor_batch_keys=["reward_model"])
    with pytest.raises(RewardInputError, match="reward_model"):
        manager(data)

    data = make_batch(["a"], ["s"], [""])
    data.non_tensor_batch["reward_model"] = np.array([{"answer": "1"}], dtype=object)
    with pytest.raises(RewardInputError, match=r"\[0\].*ground_truth"):
        manager(data)

    data = make_batch(["a"], ["s"], [""])
    with pytest.raises(RewardInputError, match="'source'"):
        RewardManager(CharTokenizer(), compute_score=lambda **kw: 0.0, reward_fn_key="source")(data)

    data = make_batch(["a"], ["s"], [""])
    data.pop(batch_keys=["attention_mask", "response_mask"])
    with pytest.raises(RewardInputError, match="attention_mask.*response_mask"):
        manager(data)

    data = make_batch(["a"], ["s"], [""])
    data.pop(batch_keys=["responses"])
    with pytest.raises(RewardInputError, match="responses"):
        manager(data)


def test_empty_batch():
    data = make_batch([], [], [])
    out = RewardManager(CharTokenizer())(data, return_dict=True)
    assert out["reward_tensor"].shape == (0, 10)
    assert out["metrics"]["reward/errors"] == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_error": "ignore"}, "on_error"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"num_workers": 0}, "num_workers"),
        ({"reward_kwargs": {"metod": "x"}}, "metod"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardManager(CharTokenizer(), **kwargs)


def test_inline_path_without_timeout():
    data = make_batch(["#### 1", "#### 2"], ["openai/gsm8k"] * 2, ["1", "3"])
    tensor = RewardManager(CharTokenizer(), timeout_s=None, num_workers=1)(data)
    assert tensor.sum(-1).tolist() == [1.0, 0.0]
