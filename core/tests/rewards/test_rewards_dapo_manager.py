"""``reward_model.reward_manager=dapo`` and ``reward_model.reward_kwargs`` as verl uses them (issue #15).

Oracles: verl's overlong formula ``min(-(L - (max_resp_len - len)) / len * factor, 0)`` evaluated by hand
for each length, and the keywords a custom scorer records it was called with.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.config import load_config
from verl.protocol import DataProto
from verl.rewards import RewardManager
from verl.rewards.reward_managers import OverlongBuffer, RewardKwargsError, split_reward_kwargs
from verl.trainer.ppo_trainer import PPOTrainer


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if i > 1)


def _batch(texts, resp_len=10):
    bs = len(texts)
    resp = torch.zeros((bs, resp_len), dtype=torch.long)
    mask = torch.zeros((bs, resp_len), dtype=torch.long)
    for i, text in enumerate(texts):
        resp[i, : len(text)] = torch.tensor([ord(c) for c in text])
        mask[i, : len(text)] = 1
    return DataProto.from_dict(
        tensors={"responses": resp, "response_mask": mask},
        non_tensors={
            "data_source": np.array(["my/data"] * bs, dtype=object),
            "reward_model": np.array([{"ground_truth": "abc"}] * bs, dtype=object),
        },
    )


def _always_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def test_overlong_penalty_follows_verls_formula_per_length():
    # max_resp_len 10, buffer 4, factor 0.5: expected = 6; L=3 -> 0; L=6 -> 0; L=8 -> -(2/4)*0.5; L=10 -> -0.5
    buffer = OverlongBuffer(len=4, penalty_factor=0.5, log=True, max_resp_len=10)
    data = _batch(["abc", "abcdef", "abcdefgh", "abcdefghij"])
    out = RewardManager(CharTokenizer(), compute_score=_always_one, overlong_buffer=buffer)(data, return_dict=True)
    expected = [1.0, 1.0, 1.0 - 0.25, 1.0 - 0.5]
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx(expected)
    assert out["reward_tensor"][2, 7].item() == pytest.approx(0.75)  # still on the last valid token
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx([0.0, 0.0, -0.25, -0.5])
    assert out["reward_extra_info"]["overlong"] == [False, False, True, True]
    plain = RewardManager(CharTokenizer(), compute_score=_always_one)(data)
    assert plain.sum(-1).tolist() == [1.0] * 4  # naive: no penalty


def test_split_reward_kwargs_gives_the_manager_its_keys_and_the_scorer_the_rest():
    kwargs = {
        "method": "flexible",
        "max_resp_len": 10,
        "overlong_buffer_cfg": {"enable": True, "len": 4, "penalty_factor": 0.5, "log": False},
    }
    buffer, rest = split_reward_kwargs("dapo", kwargs)
    assert buffer == OverlongBuffer(len=4, penalty_factor=0.5, log=False, max_resp_len=10) and rest == {
        "method": "flexible"
    }
    assert split_reward_kwargs("naive", {"method": "flexible"}) == (None, {"method": "flexible"})
    disabled = {"max_resp_len": 10, "overlong_buffer_cfg": {"enable": False, "len": 4}}
    assert split_reward_kwargs("dapo", disabled) == (None, {})
    with pytest.raises(ValueError, match="max_resp_len must be set"):
        split_reward_kwargs("dapo", {"overlong_buffer_cfg": {"enable": True, "len": 4}})
    with pytest.raises(ValueError, match="len=12 must be > 0 and <= max_resp_len=10"):
        split_reward_kwargs("dapo", {"max_resp_len": 10, "overlong_buffer_cfg": {"enable": True, "len": 12}})
    with pytest.raises(ValueError, match="isolation=process"):
        split_reward_kwargs("prime", {})


@pytest.mark.parametrize(
    "manager,kwargs,key",
    [
        ("dapo", {"max_resp_len": "10"}, "reward_model.reward_kwargs.max_resp_len"),
        ("dapo", {"max_resp_len": 10.0}, "reward_model.reward_kwargs.max_resp_len"),
        ("dapo", {"max_resp_len": 10, "overlong_buffer_cfg": {"len": True}}, "overlong_buffer_cfg.len"),
        ("dapo", {"max_resp_len": 10, "overlong_buffer_cfg": {"enable": "yes"}}, "overlong_buffer_cfg.enable"),
        ("dapo", {"overlong_buffer_cfg": {"penalty_factor": False}}, "overlong_buffer_cfg.penalty_factor"),
        ("dapo", {"overlong_buffer_cfg": [4]}, "reward_model.reward_kwargs.overlong_buffer_cfg"),
        ("naive", {"max_resp_len": 10}, "reward_model.reward_kwargs.max_resp_len"),
        ("nave", {}, "reward_model.reward_manager"),
    ],
)
def test_split_reward_kwargs_names_the_key_of_a_bad_value(manager, kwargs, key):
    with pytest.raises(RewardKwargsError) as info:
        split_reward_kwargs(manager, kwargs)
    assert info.value.key.endswith(key) and str(info.value).startswith(info.value.key)


def _manager(tmp_path, *overrides):
    scorer = tmp_path / "scorer.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    return {'score': float(len(solution_str)), 'kw': sorted(kwargs.items())}\n"
    )
    cfg = load_config(overrides=[f"custom_reward_function.path={scorer}", "reward_model.isolation=thread", *overrides])
    return PPOTrainer._build_reward_manager(SimpleNamespace(config=cfg, tokenizer=CharTokenizer()))


def test_reward_kwargs_reach_a_custom_scorer_and_dapo_penalises_it(tmp_path):
    manager = _manager(
        tmp_path,
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.bonus=2",
        "+reward_model.reward_kwargs.max_resp_len=10",
        "+reward_model.reward_kwargs.overlong_buffer_cfg={enable: true, len: 4, penalty_factor: 1.0, log: false}",
        "+custom_reward_function.reward_kwargs.bonus=3",
        "+custom_reward_function.reward_kwargs.tag=x",
    )
    out = manager(_batch(["abc", "abcdefgh"]), return_dict=True)
    # scores 3 and 8; L=8 exceeds expected 6 by 2 -> -0.5. custom_reward_function.reward_kwargs win on bonus.
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([3.0, 7.5])
    assert out["reward_extra_info"]["kw"][0] == [("bonus", 3), ("tag", "x")]
    only_rm = _manager(tmp_path, "+reward_model.reward_kwargs.bonus=2")
    assert only_rm(_batch(["abc"]), return_dict=True)["reward_extra_info"]["kw"][0] == [("bonus", 2)]
