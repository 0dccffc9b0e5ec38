"""DataProto construction, validation, length and single-row access (verl/protocol.py semantics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import verl
from verl.protocol import (
    AUTO_PADDING_KEY,
    DataProto,
    DataProtoConfig,
    DataProtoError,
    DataProtoIndexError,
    DataProtoItem,
    DataProtoKeyError,
    DataProtoTypeError,
)


def test_lazy_top_level_import_is_the_same_class():
    assert verl.DataProto is DataProto
    assert verl.DataProtoItem is DataProtoItem


def test_error_hierarchy():
    assert issubclass(DataProtoError, ValueError)
    assert issubclass(DataProtoKeyError, KeyError) and issubclass(DataProtoKeyError, DataProtoError)
    assert issubclass(DataProtoTypeError, TypeError) and issubclass(DataProtoTypeError, DataProtoError)
    assert issubclass(DataProtoIndexError, IndexError)
    # KeyError normally repr()-quotes its message; ours prints it verbatim.
    assert str(DataProtoKeyError("batch['x'] not found")) == "batch['x'] not found"


def test_from_dict_splits_fields_and_keeps_dtypes():
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int32)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]], dtype=torch.bfloat16)
    scores = np.array([0.5, 1.5, 2.5], dtype=np.float32)
    data = DataProto.from_dict(
        tensors={"input_ids": ids, "mask": mask},
        non_tensors={"uid": ["a", "b", "c"], "score": scores},
        meta_info={"temperature": 0.7},
    )
    assert len(data) == 3
    assert isinstance(data.batch, TensorDict) and data.batch.batch_size == torch.Size([3])
    assert data.batch["input_ids"].dtype == torch.int32 and data.batch["mask"].dtype == torch.bfloat16
    assert torch.equal(data.batch["input_ids"], ids)
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
    assert data.non_tensor_batch["score"] is scores  # ndarrays are kept as given
    assert data.meta_info == {"temperature": 0.7}


def test_from_dict_keeps_equal_length_nested_lists_as_one_object_per_row():
    messages = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]
    data = DataProto.from_dict(non_tensors={"raw_prompt": messages})
    assert data.non_tensor_batch["raw_prompt"].shape == (2,)
    assert data.non_tensor_batch["raw_prompt"][1] == [{"role": "user", "content": "yo"}]
    assert data.batch is None and len(data) == 2


def test_from_dict_does_not_mutate_inputs_and_sets_auto_padding():
    non_tensors = {"uid": ["a"]}
    meta = {"k": 1}
    data = DataProto.from_dict(
        tensors={"x": torch.zeros(1)}, non_tensors=non_tensors, meta_info=meta, auto_padding=True
    )
    assert non_tensors == {"uid": ["a"]} and meta == {"k": 1}
    assert data.meta_info == {"k": 1, AUTO_PADDING_KEY: True}
    assert data.is_padding_enabled()


def test_from_dict_empty_is_length_zero():
    data = DataProto.from_dict()
    assert len(data) == 0 and data.batch is None and data.non_tensor_batch == {} and data.meta_info == {}


def test_from_dict_tensor_size_mismatch_names_both_keys():
    with pytest.raises(DataProtoError, match=r"tensors\['b'\] has 3 rows but tensors\['a'\] has 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2, 4), "b": torch.zeros(3, 4)})


def test_from_dict_non_tensor_length_mismatch_message():
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['uid'\] has 3 rows but batch has 4"):
        DataProto.from_dict(tensors={"x": torch.zeros(4)}, non_tensors={"uid": ["a", "b", "c"]})


def test_from_dict_rejects_numpy_in_tensors_and_scalars_in_non_tensors():
    with pytest.raises(DataProtoTypeError, match=r"tensors\['x'\].*non_tensors"):
        DataProto.from_dict(tensors={"x": np.zeros(3)})
    with pytest.raises(DataProtoTypeError, match=r"non_tensors\['n'\]"):
        DataProto.from_dict(non_tensors={"n": 3})
    with pytest.raises(DataProtoError, match="0-d"):
        DataProto.from_dict(tensors={"x": torch.tensor(1.0)})
    with pytest.raises(DataProtoError, match="num_batch_dims=1"):
        DataProto.from_dict(tensors={"x": torch.zeros(2, 2)}, num_batch_dims=2)


def test_from_single_dict_routes_by_type():
    data = DataProto.from_single_dict(
        {"ids": torch.arange(3), "uid": np.array(["a", "b", "c"], dtype=object)}, meta_info={"m": 1}
    )
    assert list(data.batch.keys()) == ["ids"] and list(data.non_tensor_batch) == ["uid"]
    assert data.meta_info == {"m": 1}
    # verl raises ValueError for unsupported values; DataProtoTypeError is both a ValueError and a TypeError.
    with pytest.raises(ValueError, match=r"data\['lst'\]"):
        DataProto.from_single_dict({"lst": [1, 2]})


def test_check_consistency_errors():
    with pytest.raises(DataProtoError, match="exactly one batch dim"):
        DataProto(batch=TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3]))
    with pytest.raises(DataProtoTypeError, match=r"non_tensor_batch\['uid'\] must be a np.ndarray"):
        DataProto(batch=TensorDict({"x": torch.zeros(2)}, batch_size=[2]), non_tensor_batch={"uid": ["a", "b"]})
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['b'\] has 1 rows but non_tensor_batch\['a'\] has 2"):
        DataProto(non_tensor_batch={"a": np.zeros(2), "b": np.zeros(1)})
    with pytest.raises(DataProtoTypeError, match="meta_info must be a dict"):
        DataProto(meta_info=[1])
    with pytest.raises(DataProtoTypeError, match="batch must be a TensorDict"):
        DataProto(batch={"x": torch.zeros(2)})
    td = TensorDict({"x": torch.zeros(2)}, batch_size=[2])
    td["obj"] = np.array(["a", "b"], dtype=object)  # tensordict stores this as non-tensor data
    with pytest.raises(DataProtoTypeError, match=r"batch\['obj'\] holds non-tensor data"):
        DataProto(batch=td)


def test_len_without_batch_uses_non_tensor():
    assert len(DataProto(non_tensor_batch={"u": np.array([1, 2, 3])})) == 3


def test_int_index_returns_item():
    data = DataProto.from_dict(
        tensors={"x": torch.tensor([[0, 1], [2, 3], [4, 5]])}, non_tensors={"uid": ["a", "b", "c"]}, meta_info={"m": 1}
    )
    item = data[1]
    assert isinstance(item, DataProtoItem)
    assert item.batch.batch_size == torch.Size([])
    assert item.batch["x"].tolist() == [2, 3]
    assert item.non_tensor_batch == {"uid": "b"}
    assert item.meta_info == {"m": 1}
    assert data[-1].non_tensor_batch["uid"] == "c"
    assert data[np.int64(0)].batch["x"].tolist() == [0, 1]
    with pytest.raises(DataProtoIndexError, match="index 3 is out of range for a DataProto of 3 rows"):
        data[3]
    with pytest.raises(DataProtoTypeError, match="Indexing with bool"):
        data[True]
    with pytest.raises(DataProtoTypeError, match="Indexing with str"):
        data["x"]
    # Legacy iteration protocol stops at IndexError.
    assert [item.non_tensor_batch["uid"] for item in data] == ["a", "b", "c"]


def test_auto_padding_switches(monkeypatch):
    data = DataProto.from_dict(tensors={"x": torch.zeros(2)})
    monkeypatch.delenv("VERL_AUTO_PADDING", raising=False)
    assert not data.is_padding_enabled()
    monkeypatch.setenv("VERL_AUTO_PADDING", "true")
    assert data.is_padding_enabled()
    monkeypatch.delenv("VERL_AUTO_PADDING")
    DataProtoConfig.auto_padding = True
    try:
        assert data.is_padding_enabled()
    finally:
        DataProtoConfig.auto_padding = False
    with pytest.raises(DataProtoTypeError):
        DataProtoConfig.auto_padding = "yes"


def test_repr_is_short():
    data = DataProto.from_dict(tensors={"x": torch.zeros(1000, 10)}, non_tensors={"u": ["a"] * 1000})
    text = repr(data)
    assert "len=1000" in text and "(1000, 10)" in text and len(text) < 200
