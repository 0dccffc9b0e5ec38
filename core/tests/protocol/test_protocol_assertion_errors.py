"""Union / concat conflicts and size mismatches stay catchable as AssertionError, as verl's asserts are.

verl code and verl's tests (tests/test_protocol_on_cpu.py) write ``pytest.raises(AssertionError)`` /
``except AssertionError`` around these calls; here the errors carry clearer messages but keep that class.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import (
    DataProto,
    DataProtoConflictError,
    DataProtoError,
    DataProtoSizeError,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)


def test_conflict_and_size_errors_are_assertion_and_value_errors():
    for cls in (DataProtoConflictError, DataProtoSizeError):
        assert issubclass(cls, AssertionError) and issubclass(cls, ValueError) and issubclass(cls, DataProtoError)


def test_union_tensor_dict_conflict_is_caught_by_except_assertion_error():
    obs = torch.arange(12.0).reshape(4, 3)
    td1 = TensorDict({"obs": obs, "act": torch.zeros(4)}, batch_size=[4])
    same = TensorDict({"obs": obs.clone(), "rew": torch.ones(4)}, batch_size=[4])
    union_tensor_dict(td1, same)  # equal values under a shared key are fine
    assert sorted(td1.keys()) == ["act", "obs", "rew"]
    other = TensorDict({"obs": obs + 1}, batch_size=[4])
    try:
        union_tensor_dict(td1, other)
    except AssertionError as error:  # the verl idiom
        assert "batch['obs'] differs" in str(error)
    else:
        pytest.fail("a conflicting key must raise")
    with pytest.raises(AssertionError, match=r"batch sizes \(4,\) and \(2,\)"):
        union_tensor_dict(td1, TensorDict({"x": torch.zeros(2)}, batch_size=[2]))


def test_union_numpy_dict_conflicts_follow_verls_cases():
    arr_3d = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    union_numpy_dict({"nd_array": arr_3d}, {"nd_array": arr_3d.copy()})
    with pytest.raises(AssertionError, match=r"non_tensor_batch\['nd_array'\] differs"):
        union_numpy_dict({"nd_array": arr_3d}, {"nd_array": arr_3d + 1})
    # NaN at the same position counts as equal; at another position it is a conflict.
    union_numpy_dict({"d": np.array([1.0, np.nan, 3.0])}, {"d": np.array([1.0, np.nan, 3.0])})
    with pytest.raises(AssertionError):
        union_numpy_dict({"d": np.array([1.0, np.nan, 3.0])}, {"d": np.array([np.nan, 1.0, 3.0])})


def test_union_two_dict_and_dataproto_union_conflicts():
    with pytest.raises(AssertionError, match=r"meta_info\['t'\] conflicts: 0.5 vs 0.6"):
        union_two_dict({"t": 0.5}, {"t": 0.6})
    a = DataProto.from_dict(tensors={"x": torch.arange(3)}, non_tensors={"uid": ["a", "b", "c"]})
    b = DataProto.from_dict(tensors={"x": torch.arange(3) * 2})
    with pytest.raises(AssertionError, match=r"batch\['x'\] differs"):
        a.union(b)
    assert a.batch["x"].tolist() == [0, 1, 2] and list(a.batch.keys()) == ["x"]  # left untouched
    with pytest.raises(AssertionError, match="3 rows with one of 2 rows"):
        a.union(DataProto.from_dict(tensors={"y": torch.zeros(2)}))


def test_concat_meta_conflict_matches_verls_message():
    # verl: pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'")
    data1 = DataProto.from_dict(tensors={"obs": torch.tensor([1, 2])}, meta_info={"config": "A"})
    data2 = DataProto.from_dict(tensors={"obs": torch.tensor([3, 4])}, meta_info={"config": "B"})
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'") as info:
        DataProto.concat([data1, data2])
    assert "part 0 has 'A', part 1 has 'B'" in str(info.value)


def test_concat_key_mismatch_is_a_conflict():
    data1 = DataProto.from_dict(tensors={"obs": torch.tensor([1])}, non_tensors={"uid": ["a"]})
    data2 = DataProto.from_dict(tensors={"obs": torch.tensor([2])})
    with pytest.raises(DataProtoConflictError, match=r"missing \['uid'\]"):
        DataProto.concat([data1, data2])


def test_size_mismatches_are_assertion_errors():
    with pytest.raises(AssertionError, match=r"tensors\['b'\] has 2 rows but tensors\['a'\] has 3"):
        DataProto.from_dict(tensors={"a": torch.zeros(3), "b": torch.zeros(2)})
    data = DataProto.from_dict(tensors={"a": torch.zeros(10)})
    with pytest.raises(AssertionError, match=r"10 rows are not divisible by mini_batch_size=4"):
        data.make_iterator(mini_batch_size=4, epochs=1)
    with pytest.raises(AssertionError, match=r"10 % 3 = 1"):
        data.chunk(3)
