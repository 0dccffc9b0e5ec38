"""select / pop / rename / union and the union helpers (verl/protocol.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import (
    DataProto,
    DataProtoError,
    DataProtoKeyError,
    DataProtoTypeError,
    deep_equal,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)


def make() -> DataProto:
    return DataProto.from_dict(
        tensors={"a": torch.tensor([1, 2, 3]), "b": torch.tensor([[1.0], [2.0], [3.0]])},
        non_tensors={"uid": ["x", "y", "z"], "gt": ["1", "2", "3"]},
        meta_info={"t": 0.5, "info": {"k": [1]}},
    )


def test_select_subsets_share_tensors():
    data = make()
    out = data.select(batch_keys=["b"], non_tensor_batch_keys=["gt"], meta_info_keys=["t"])
    assert list(out.batch.keys()) == ["b"] and list(out.non_tensor_batch) == ["gt"] and out.meta_info == {"t": 0.5}
    assert out.batch["b"].data_ptr() == data.batch["b"].data_ptr()
    assert out.non_tensor_batch["gt"] is data.non_tensor_batch["gt"]


def test_select_none_keeps_all_in_new_containers():
    data = make()
    out = data.select()
    out.batch["new"] = torch.zeros(3)
    out.non_tensor_batch["new"] = np.zeros(3)
    out.meta_info["new"] = 1
    assert "new" not in data.batch.keys() and "new" not in data.non_tensor_batch and "new" not in data.meta_info


def test_select_deepcopy_copies_non_tensor_and_meta_only():
    data = make()
    out = data.select(deepcopy=True)
    out.non_tensor_batch["uid"][0] = "changed"
    out.meta_info["info"]["k"].append(2)
    assert data.non_tensor_batch["uid"][0] == "x" and data.meta_info["info"] == {"k": [1]}
    assert out.batch["a"].data_ptr() == data.batch["a"].data_ptr()


def test_select_missing_keys_are_named():
    data = make()
    with pytest.raises(DataProtoKeyError, match=r"batch\['nope'\] not found; available keys: \['a', 'b'\]"):
        data.select(batch_keys=["nope"])
    with pytest.raises(DataProtoKeyError, match=r"non_tensor_batch\['nope'\]"):
        data.select(non_tensor_batch_keys=["nope"])
    with pytest.raises(DataProtoKeyError, match=r"meta_info\['nope'\]"):
        data.select(meta_info_keys=["nope"])
    with pytest.raises(DataProtoKeyError, match="has no batch"):
        DataProto.from_dict(non_tensors={"u": [1]}).select(batch_keys=["a"])


def test_pop_moves_keys_out():
    data = make()
    out = data.pop(batch_keys=["a"], non_tensor_batch_keys=["uid"], meta_info_keys=["t"])
    assert list(out.batch.keys()) == ["a"] and out.batch["a"].tolist() == [1, 2, 3]
    assert out.non_tensor_batch["uid"].tolist() == ["x", "y", "z"] and out.meta_info == {"t": 0.5}
    assert list(data.batch.keys()) == ["b"] and list(data.non_tensor_batch) == ["gt"]
    assert data.meta_info == {"info": {"k": [1]}}
    assert len(data) == 3


def test_pop_only_meta_gives_empty_batch():
    out = make().pop(meta_info_keys=["t"])
    assert out.batch is None and len(out) == 0 and out.meta_info == {"t": 0.5}


def test_pop_is_atomic_on_missing_key():
    data = make()
    with pytest.raises(DataProtoKeyError, match=r"non_tensor_batch\['missing'\]"):
        data.pop(batch_keys=["a"], non_tensor_batch_keys=["missing"])
    assert set(data.batch.keys()) == {"a", "b"}


def test_pop_all_tensors_keeps_length():
    data = make()
    data.pop(batch_keys=["a", "b"])
    assert len(data) == 3 and list(data.batch.keys()) == []


def test_rename():
    data = make()
    assert data.rename("a", "A") is data
    assert set(data.batch.keys()) == {"A", "b"} and data.batch["A"].tolist() == [1, 2, 3]
    data.rename(["A", "b"], ["b", "a"])  # swap through the same call
    assert data.batch["b"].tolist() == [1, 2, 3] and data.batch["a"].tolist() == [[1.0], [2.0], [3.0]]


def test_rename_errors():
    data = make()
    with pytest.raises(DataProtoTypeError):
        data.rename(1, "x")
    with pytest.raises(DataProtoError, match="same length, got 2 and 1"):
        data.rename(["a", "b"], ["c"])
    with pytest.raises(DataProtoKeyError, match=r"batch\['zz'\] not found"):
        data.rename("zz", "c")
    with pytest.raises(DataProtoKeyError, match=r"batch\['b'\] already exists"):
        data.rename("a", "b")


def test_union_merges_all_three_fields():
    left = make()
    right = DataProto.from_dict(
        tensors={"a": torch.tensor([1, 2, 3]), "c": torch.tensor([7, 8, 9])},
        non_tensors={"uid": ["x", "y", "z"], "score": np.array([1.0, np.nan, 0.0])},
        meta_info={"t": 0.5, "n": 2},
    )
    assert left.union(right) is left
    assert set(left.batch.keys()) == {"a", "b", "c"} and left.batch["c"].tolist() == [7, 8, 9]
    assert set(left.non_tensor_batch) == {"uid", "gt", "score"}
    assert left.meta_info == {"t": 0.5, "info": {"k": [1]}, "n": 2}


def test_union_conflicts_name_the_key_and_leave_self_unchanged():
    data = make()
    bad_tensor = DataProto.from_dict(tensors={"c": torch.zeros(3), "a": torch.tensor([1, 2, 4])})
    with pytest.raises(DataProtoError, match=r"batch\['a'\] differs"):
        data.union(bad_tensor)
    assert "c" not in data.batch.keys()
    bad_array = DataProto.from_dict(tensors={"c": torch.zeros(3)}, non_tensors={"uid": ["x", "y", "Q"]})
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['uid'\] differs"):
        data.union(bad_array)
    assert "c" not in data.batch.keys()
    bad_meta = DataProto.from_dict(tensors={"c": torch.zeros(3)}, meta_info={"t": 0.6})
    with pytest.raises(DataProtoError, match=r"meta_info\['t'\] conflicts: 0.5 vs 0.6"):
        data.union(bad_meta)
    assert "c" not in data.batch.keys()
    with pytest.raises(DataProtoError, match="3 rows with one of 2 rows"):
        data.union(DataProto.from_dict(tensors={"c": torch.zeros(2)}))
    with pytest.raises(DataProtoTypeError):
        data.union({"a": 1})


def test_union_adopts_batch_when_self_has_none():
    left = DataProto.from_dict(non_tensors={"uid": ["x", "y"]})
    right = DataProto.from_dict(tensors={"r": torch.tensor([5, 6])})
    left.union(right)
    assert left.batch["r"].tolist() == [5, 6]
    left.batch["extra"] = torch.zeros(2)
    assert "extra" not in right.batch.keys()


def test_union_tensor_dict_helper():
    td1 = TensorDict({"a": torch.ones(2)}, batch_size=[2])
    td2 = TensorDict({"a": torch.ones(2), "b": torch.zeros(2, 3)}, batch_size=[2])
    out = union_tensor_dict(td1, td2)
    assert out is td1 and set(td1.keys()) == {"a", "b"}
    with pytest.raises(DataProtoError, match=r"batch sizes \(2,\) and \(3,\)"):
        union_tensor_dict(td1, TensorDict({}, batch_size=[3]))
    # same values but different dtype are not "the same tensor"
    with pytest.raises(DataProtoError, match=r"batch\['a'\]"):
        union_tensor_dict(td1, TensorDict({"a": torch.ones(2, dtype=torch.float64)}, batch_size=[2]))


def test_union_numpy_dict_helper_nan_and_objects():
    d1 = {"f": np.array([1.0, np.nan]), "o": np.array([{"k": [1, 2]}, None], dtype=object)}
    d2 = {"f": np.array([1.0, np.nan]), "o": np.array([{"k": [1, 2]}, None], dtype=object), "n": np.zeros(2)}
    assert set(union_numpy_dict(d1, d2)) == {"f", "o", "n"}
    with pytest.raises(DataProtoTypeError, match=r"non_tensor_batch\['x'\]"):
        union_numpy_dict({}, {"x": [1, 2]})
    with pytest.raises(DataProtoError, match=r"\['o'\]"):
        union_numpy_dict(d1, {"o": np.array([{"k": [1, 3]}, None], dtype=object)})


def test_union_two_dict_helper():
    assert union_two_dict({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    assert union_two_dict({"a": torch.tensor([1.0])}, {"a": torch.tensor([1.0])})["a"].item() == 1.0
    with pytest.raises(DataProtoError, match=r"meta_info\['a'\]"):
        union_two_dict({"a": np.array([1, 2])}, {"a": np.array([1, 3])})


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (float("nan"), float("nan"), True),
        (1, 1.0, False),
        ([1, {"x": np.array([1.0, math.nan])}], [1, {"x": np.array([1.0, math.nan])}], True),
        ({"x": torch.tensor([1, 2])}, {"x": torch.tensor([1, 3])}, False),
        (np.array([np.array([1, 2]), None], dtype=object), np.array([np.array([1, 2]), None], dtype=object), True),
        (np.array([np.array([1, 2]), None], dtype=object), np.array([np.array([1, 9]), None], dtype=object), False),
        (torch.tensor([math.nan]), torch.tensor([math.nan]), True),
        (np.zeros(2, np.float32), np.zeros(2, np.float64), False),
    ],
)
def test_deep_equal(a, b, equal):
    assert deep_equal(a, b) is equal


def test_deep_equal_cycles_terminate():
    a: list = [1]
    a.append(a)
    b: list = [1]
    b.append(b)
    assert deep_equal(a, b)


def test_to_moves_batch_in_place():
    data = make()
    assert data.to("cpu") is data
    assert data.batch.device == torch.device("cpu")
    assert data.non_tensor_batch["uid"].dtype == object
