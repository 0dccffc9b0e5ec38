"""fold_batch_dim / unfold_batch_dim / DataProto.unfold_column_chunks (verl/protocol.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import (
    DataProto,
    DataProtoError,
    DataProtoKeyError,
    DataProtoSizeError,
    fold_batch_dim,
    unfold_batch_dim,
)


def test_fold_reorder_unfold_follows_verls_example():
    # verl's test: rows [1,2],[3,4],[5,6] repeated twice (interleaved), folded to 3, rows reordered, unfolded.
    data = DataProto.from_dict(
        tensors={"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])},
        non_tensors={"labels": ["a", "b", "c"]},
        meta_info={"i": 1},
    )
    data1 = data.repeat(repeat_times=2, interleave=True)
    data2 = fold_batch_dim(data1, new_batch_size=3)
    assert len(data2) == 3 and tuple(data2.batch.batch_size) == (3,)
    assert data2.batch["obs"].tolist() == [[[1, 2], [1, 2]], [[3, 4], [3, 4]], [[5, 6], [5, 6]]]
    assert data2.non_tensor_batch["labels"].tolist() == [["a", "a"], ["b", "b"], ["c", "c"]]
    data2.reorder(torch.tensor([1, 2, 0]))
    data3 = unfold_batch_dim(data2, batch_dims=2)
    assert data3.batch["obs"].tolist() == [[3, 4], [3, 4], [5, 6], [5, 6], [1, 2], [1, 2]]
    assert data3.non_tensor_batch["labels"].tolist() == ["b", "b", "c", "c", "a", "a"]
    assert data3.meta_info == {"i": 1}
    # Inputs are untouched (verl rewrites data1.non_tensor_batch and data2.batch.batch_size in place).
    assert data1.non_tensor_batch["labels"].shape == (6,) and tuple(data2.batch.batch_size) == (3,)


def test_fold_matches_numpy_reshape_for_every_field():
    ids = torch.arange(24).reshape(6, 4)
    score = np.arange(6, dtype=np.float32) / 2
    data = DataProto.from_dict(
        tensors={"ids": ids, "mask": ids % 2 == 0}, non_tensors={"score": score, "uid": [f"u{i}" for i in range(6)]}
    )
    folded = fold_batch_dim(data, 2)
    np.testing.assert_array_equal(folded.batch["ids"].numpy(), ids.numpy().reshape(2, 3, 4))
    np.testing.assert_array_equal(folded.batch["mask"].numpy(), (ids.numpy() % 2 == 0).reshape(2, 3, 4))
    np.testing.assert_array_equal(folded.non_tensor_batch["score"], score.reshape(2, 3))
    assert folded.non_tensor_batch["score"].dtype == np.float32
    assert folded.non_tensor_batch["uid"].tolist() == [["u0", "u1", "u2"], ["u3", "u4", "u5"]]
    back = unfold_batch_dim(folded)
    assert torch.equal(back.batch["ids"], ids) and back.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(6)]


def test_fold_keeps_nested_keys_and_handles_no_batch():
    data = DataProto.from_dict(tensors={"x": torch.arange(4)})
    data.batch["sub", "y"] = torch.arange(4) * 10
    folded = fold_batch_dim(data, 2)
    assert folded.batch["sub", "y"].tolist() == [[0, 10], [20, 30]]
    assert tuple(folded.batch["sub"].batch_size) == (2,)
    only_arrays = DataProto.from_dict(non_tensors={"u": list("abcd")})
    assert fold_batch_dim(only_arrays, 1).non_tensor_batch["u"].tolist() == [["a", "b", "c", "d"]]


def test_fold_and_unfold_errors():
    data = DataProto.from_dict(tensors={"x": torch.zeros(6, 2)}, non_tensors={"u": np.zeros(6)})
    with pytest.raises(AssertionError, match=r"6 rows are not divisible by new_batch_size=4"):
        fold_batch_dim(data, 4)
    with pytest.raises(DataProtoError, match="new_batch_size must be >= 1"):
        fold_batch_dim(data, 0)
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['u'\] has shape \(6,\), fewer than 2 dims"):
        unfold_batch_dim(data, 2)
    mixed = DataProto.from_dict(tensors={"x": torch.zeros(3, 2), "y": torch.zeros(3, 4)})
    with pytest.raises(
        DataProtoSizeError, match=r"batch\['y'\] starts with \(3, 4\) but batch\['x'\] starts with \(3, 2\)"
    ):
        unfold_batch_dim(mixed, 2)


def test_unfold_column_chunks_follows_verls_example():
    obs1 = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    obs2 = torch.tensor([[1, 2], [5, 6], [9, 10]])
    data = DataProto.from_dict(
        tensors={"obs1": obs1, "obs2": obs2}, non_tensors={"labels": ["a", "b", "c"]}, meta_info={"name": "abc"}
    )
    ret = data.unfold_column_chunks(2, split_keys=["obs1"])
    assert ret.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    assert ret.batch["obs2"].tolist() == [[1, 2], [1, 2], [5, 6], [5, 6], [9, 10], [9, 10]]
    assert ret.non_tensor_batch["labels"].tolist() == ["a", "a", "b", "b", "c", "c"]
    assert ret.meta_info == {"name": "abc"} and len(ret) == 6


def test_unfold_column_chunks_splits_lists_and_2d_arrays():
    data = DataProto.from_dict(
        tensors={"x": torch.tensor([[[1, 1], [2, 2], [3, 3], [4, 4]], [[5, 5], [6, 6], [7, 7], [8, 8]]])},
        non_tensors={
            "labels": [["a1", "a2"], ["b1", "b2"]],  # a 1-D object array of lists
            "grid": np.arange(8, dtype=np.int16).reshape(2, 4),
        },
    )
    ret = data.unfold_column_chunks(2, split_keys=["x", "labels", "grid"])
    assert ret.batch["x"].tolist() == [[[1, 1], [2, 2]], [[3, 3], [4, 4]], [[5, 5], [6, 6]], [[7, 7], [8, 8]]]
    assert ret.non_tensor_batch["labels"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"]]
    assert ret.non_tensor_batch["grid"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ret.non_tensor_batch["grid"].dtype == np.int16
    # split_keys=None repeats every field (verl's documented behaviour).
    repeated = data.unfold_column_chunks(3)
    assert repeated.non_tensor_batch["grid"].tolist() == [[0, 1, 2, 3]] * 3 + [[4, 5, 6, 7]] * 3
    assert torch.equal(repeated.batch["x"], data.batch["x"].repeat_interleave(3, dim=0))


def test_unfold_column_chunks_errors():
    data = DataProto.from_dict(tensors={"x": torch.zeros(2, 5), "flat": torch.zeros(2)}, non_tensors={"u": ["a", "b"]})
    with pytest.raises(DataProtoKeyError, match=r"split_keys \['typo'\] are in neither"):
        data.unfold_column_chunks(2, split_keys=["typo"])
    with pytest.raises(AssertionError, match=r"dim 1 of batch\['x'\] \(5\) is not divisible by n_split=2"):
        data.unfold_column_chunks(2, split_keys=["x"])
    with pytest.raises(DataProtoError, match=r"batch\['flat'\] has shape \(2,\); a split field needs a dim 1"):
        data.unfold_column_chunks(2, split_keys=["flat"])
    with pytest.raises(DataProtoError, match=r"row 0 is a str"):
        data.unfold_column_chunks(2, split_keys=["u"])
