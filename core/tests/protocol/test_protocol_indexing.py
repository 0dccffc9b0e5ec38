"""Slicing, fancy indexing, boolean masks and reorder (verl/protocol.py __getitem__/select_idxs/slice/reorder)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, DataProtoError, DataProtoIndexError, DataProtoTypeError


def make(n: int = 5) -> DataProto:
    # row r: x = [10r, 10r + 1], uid = "u{r}", score = r / 2
    return DataProto.from_dict(
        tensors={"x": torch.tensor([[10 * r, 10 * r + 1] for r in range(n)])},
        non_tensors={"uid": [f"u{r}" for r in range(n)], "score": np.arange(n, dtype=np.float64) / 2},
        meta_info={"m": "meta"},
    )


def rows(data: DataProto) -> list:
    """Row ids recovered independently from each field; all fields must agree."""
    from_x = (data.batch["x"][:, 0] // 10).tolist()
    from_uid = [int(u[1:]) for u in data.non_tensor_batch["uid"]]
    from_score = (data.non_tensor_batch["score"] * 2).astype(int).tolist()
    assert from_x == from_uid == from_score
    return from_x


def test_make_layout():
    data = make(3)
    assert data.batch["x"].tolist() == [[0, 1], [10, 11], [20, 21]]


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (slice(1, 4), [1, 2, 3]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(-2, None), [3, 4]),
        (slice(None, None, -1), [4, 3, 2, 1, 0]),
        (slice(3, 0, -2), [3, 1]),
        (slice(7, 9), []),
    ],
)
def test_slices(index, expected):
    out = make()[index]
    assert isinstance(out, DataProto)
    assert rows(out) == expected
    assert out.meta_info == {"m": "meta"}


def test_slice_is_a_view_and_meta_is_a_copy():
    data = make()
    part = data[1:3]
    part.batch["x"][0, 0] = -1
    assert data.batch["x"][1, 0] == -1
    part.meta_info["new"] = 1
    assert "new" not in data.meta_info


def test_slice_step_zero():
    with pytest.raises(DataProtoError, match="step cannot be zero"):
        make().slice(0, 3, 0)


@pytest.mark.parametrize(
    "index",
    [
        [4, 0, 0, 2],
        np.array([4, 0, 0, 2]),
        torch.tensor([4, 0, 0, 2]),
        [-1, 0, -5, 2],
        np.array([4, 0, 0, 2], np.uint8),
    ],
)
def test_integer_indices_gather_every_field(index):
    assert rows(make()[index]) == [4, 0, 0, 2]


@pytest.mark.parametrize(
    "mask",
    [
        [True, False, True, True, False],
        np.array([True, False, True, True, False]),
        torch.tensor([True, False, True, True, False]),
    ],
)
def test_boolean_masks(mask):
    out = make()[mask]
    assert len(out) == 3 and rows(out) == [0, 2, 3]


def test_empty_selection():
    out = make()[[]]
    assert len(out) == 0 and out.non_tensor_batch["uid"].shape == (0,)


def test_index_errors_name_sizes():
    data = make()
    with pytest.raises(DataProtoError, match="boolean index has 2 entries but the DataProto has 5 rows"):
        data[[True, False]]
    with pytest.raises(DataProtoIndexError, match="contains 5, out of range for a DataProto of 5 rows"):
        data[[0, 5]]
    with pytest.raises(DataProtoIndexError, match="contains -6"):
        data[np.array([-6])]
    with pytest.raises(DataProtoTypeError, match="dtype float"):
        data[torch.tensor([0.0, 1.0])]
    with pytest.raises(DataProtoError, match="must be 1-D"):
        data[np.zeros((2, 2), dtype=int)]


def test_select_idxs_keeps_dtype_and_copies():
    data = make()
    out = data.select_idxs([1])
    assert out.non_tensor_batch["score"].dtype == np.float64 and out.batch["x"].dtype == data.batch["x"].dtype
    out.batch["x"][0, 0] = 999
    assert data.batch["x"][1, 0] == 10


def test_reorder_in_place():
    data = make(4)
    assert data.reorder(torch.tensor([3, 1, 0, 2])) is None
    assert rows(data) == [3, 1, 0, 2]
    data.reorder(np.array([1, 1]))  # verl allows any positions; the length follows the index
    assert rows(data) == [1, 1]


def test_no_batch_indexing():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]})
    assert data[[2, 0]].non_tensor_batch["uid"].tolist() == ["c", "a"]
    assert data[1:].non_tensor_batch["uid"].tolist() == ["b", "c"]
    assert data[0].batch is None
