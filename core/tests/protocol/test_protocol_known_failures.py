"""Regression tests for known failures K11, K12, K13 (/work/shared/cases/known-failures.md), exact inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, DataProtoError, pad_dataproto_to_divisor, unpad_dataproto


def test_k11_padding_to_a_divisor_larger_than_the_batch():
    data = DataProto.from_dict(tensors={"ids": torch.tensor([0, 1])}, non_tensors={"field": ["x", "y"]})
    padded, pad_size = pad_dataproto_to_divisor(data, 8)
    assert len(padded) == 8 and pad_size == 6
    assert padded.batch["ids"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert padded.non_tensor_batch["field"].tolist() == ["x", "y", "x", "y", "x", "y", "x", "y"]
    # dispatch to 8 workers must not hit the equal-chunk check
    assert [len(piece) for piece in padded.chunk(8)] == [1] * 8
    restored = unpad_dataproto(padded, pad_size)
    assert restored.batch["ids"].tolist() == [0, 1]
    assert restored.non_tensor_batch["field"].tolist() == ["x", "y"]


def test_k12_micro_batch_split_when_size_does_not_divide():
    data = DataProto.from_dict(tensors={"row": torch.arange(124)}, non_tensors={"uid": np.arange(124).astype(str)})
    pieces = data.split(8)
    assert len(pieces) == 16
    assert [len(p) for p in pieces] == [8] * 15 + [4]
    assert sum(len(p) for p in pieces) == 124
    joined = DataProto.concat(pieces)
    assert joined.batch["row"].tolist() == list(range(124))
    assert joined.non_tensor_batch["uid"].tolist() == [str(i) for i in range(124)]
    # Asking for pieces by count must fail loudly (verl asserts), never drop or reshape silently.
    with pytest.raises(DataProtoError, match=r"124 rows into 15 equal chunks \(124 % 15 = 4\)"):
        data.chunk(15)


def grpo_advantages(scores: np.ndarray, uids: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Outcome GRPO (verl/trainer/ppo/core_algos.py): per-uid (score - mean) / (unbiased std + eps)."""
    adv = np.zeros_like(scores, dtype=np.float64)
    for uid in dict.fromkeys(uids.tolist()):
        members = uids == uid
        group = scores[members]
        std = group.std(ddof=1) if group.size > 1 else 1.0
        adv[members] = (group - group.mean()) / (std + eps)
    return adv


def test_k13_repeat_interleave_moves_every_field_together():
    prompts = DataProto.from_dict(
        tensors={"prompt_ids": torch.tensor([[10, 11], [20, 21]])},
        non_tensors={"uid": ["u0", "u1"], "ground_truth": ["g0", "g1"]},
    )
    repeated = prompts.repeat(repeat_times=3, interleave=True)
    assert repeated.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert repeated.non_tensor_batch["ground_truth"].tolist() == ["g0", "g0", "g0", "g1", "g1", "g1"]
    assert repeated.batch["prompt_ids"][:, 0].tolist() == [10, 10, 10, 20, 20, 20]

    rollout = DataProto.from_dict(
        tensors={
            "prompt_ids": torch.tensor([[10, 11]] * 3 + [[20, 21]] * 3),
            "scores": torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]),
        }
    )
    merged = repeated.union(rollout)  # shared key prompt_ids must agree row by row
    advantages = grpo_advantages(merged.batch["scores"].numpy(), merged.non_tensor_batch["uid"])
    np.testing.assert_allclose(advantages, np.zeros(6), atol=1e-6)

    # The known wrong result: tiling uid while responses stay grouped.
    tiled = prompts.repeat(repeat_times=3, interleave=False)
    assert tiled.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1", "u0", "u1"]
    wrong = grpo_advantages(rollout.batch["scores"].numpy(), tiled.non_tensor_batch["uid"])
    np.testing.assert_allclose(wrong, [0.577, 1.155, 0.577, -0.577, -1.155, -0.577], atol=1e-3)
    with pytest.raises(DataProtoError, match=r"batch\['prompt_ids'\] differs"):
        tiled.union(rollout)
