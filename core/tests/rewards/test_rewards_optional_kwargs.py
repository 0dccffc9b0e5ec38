"""``reward_model.reward_kwargs`` reach a custom reward function only when it takes them.

verl passes ``reward_model.reward_kwargs`` to the reward manager and never to a custom function; here they are
also the built-in scorers' options (the built-in run config sets gsm8k's ``method`` and ``format_score``), so a
custom function written with verl's documented signature must still load, with a warning naming what it does not
receive, and a function that takes them (by name or ``**kwargs``) gets them.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rewards import RewardManager
from verl.rewards.custom import split_accepted_kwargs
from verl.rewards.manager import ScorerSpec

SCORERS = """
def plain(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def takes_format_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    return 10.0 + format_score


def takes_all(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(len(kwargs)) + kwargs.get("format_score", 0.0) + kwargs.get("bonus", 0.0)
"""
OPTIONAL = {"method": "strict", "format_score": 0.25}


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def _batch() -> DataProto:
    responses = torch.tensor([[ord("a"), ord("b")]])
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": torch.ones_like(responses)},
        non_tensors={
            "data_source": np.array(["my/source"], dtype=object),
            "reward_model": np.array([{"ground_truth": "x"}], dtype=object),
        },
    )


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> Path:
    file = tmp_path_factory.mktemp("scorers") / "scorers.py"
    file.write_text(textwrap.dedent(SCORERS))
    return file


def _score(path: Path, name: str, isolation: str, reward_kwargs=None) -> float:
    spec = ScorerSpec(str(path), name, dict(reward_kwargs or {}), dict(OPTIONAL))
    manager = RewardManager(CharTokenizer(), compute_score=spec, isolation=isolation, num_workers=1)
    try:
        return float(manager(_batch()).sum())
    finally:
        manager.close()


def test_split_accepted_kwargs_by_signature():
    def named(a, b=1, *, c=2):
        return a

    def var(a, **kw):
        return a

    assert split_accepted_kwargs(named, {"b": 5, "c": 6, "d": 7}) == ({"b": 5, "c": 6}, ["d"])
    assert split_accepted_kwargs(var, {"x": 1}) == ({"x": 1}, [])


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_verl_signature_loads_and_the_unused_options_are_named(path, isolation, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.rewards.manager"):
        assert _score(path, "plain", isolation) == 1.0
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "['format_score', 'method']" in warning and "plain" in warning and "**kwargs" in warning


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_function_taking_an_option_receives_it(path, isolation, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.rewards.manager"):
        assert _score(path, "takes_format_score", isolation) == pytest.approx(10.25)
    assert "['method']" in " ".join(r.getMessage() for r in caplog.records)


def test_kwargs_function_receives_all_and_custom_reward_kwargs_win(path, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.rewards.manager"):
        # two options (method, format_score) plus bonus; custom_reward_function.reward_kwargs' format_score wins
        assert _score(path, "takes_all", "thread", {"format_score": 2.0, "bonus": 0.5}) == pytest.approx(5.5)
    assert not caplog.records
