"""verl's numpy codec: serialize_single_tensor / serialize_tensordict and their inverses (verl/protocol.py)."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import (
    DataProto,
    DataProtoError,
    DataProtoTypeError,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)


def test_single_tensor_format_is_verls():
    # float32 1.0 is 0x3F800000, little-endian bytes 00 00 80 3F; 2.0 is 0x40000000.
    dtype, shape, data = serialize_single_tensor(torch.tensor([[1.0], [2.0]]))
    assert dtype == "float32" and shape == torch.Size([2, 1])
    assert isinstance(data, np.ndarray) and data.dtype == np.uint8
    assert data.tobytes() == struct.pack("<ff", 1.0, 2.0)
    # bfloat16 keeps the top 16 bits of float32: 1.0 -> 0x3F80, -2.0 -> 0xC000.
    dtype, shape, data = serialize_single_tensor(torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    assert dtype == "bfloat16" and data.tobytes() == bytes([0x80, 0x3F, 0x00, 0xC0])


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),
        torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        torch.tensor([0.5, -1.0], dtype=torch.float16),
        torch.tensor([[True, False], [False, True]]),
        torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64),
        torch.tensor([-3, 2**40], dtype=torch.int64),
        torch.tensor(7.0),  # 0-d
        torch.zeros(0, 5, dtype=torch.bfloat16),  # empty (verl's torch.frombuffer refuses it)
        torch.arange(20, dtype=torch.float64).reshape(4, 5).t(),  # non-contiguous
        torch.arange(10, dtype=torch.int32)[2:8:2],  # a strided view into a larger storage
        torch.tensor([0.5, 448.0], dtype=torch.float32).to(torch.float8_e4m3fn),
    ],
    ids=["f32", "bf16", "f16", "bool", "c64", "i64", "0d", "empty", "transposed", "strided_view", "fp8"],
)
def test_single_tensor_round_trip(tensor):
    encoded = serialize_single_tensor(tensor)
    assert encoded[2].nbytes == tensor.numel() * tensor.element_size()
    decoded = deserialize_single_tensor(pickle.loads(pickle.dumps(encoded)))
    assert decoded.dtype == tensor.dtype and decoded.shape == tensor.shape and decoded.is_contiguous()
    # bit-exact: the same bytes, element by element in row-major order
    assert torch.equal(decoded.reshape(-1).view(torch.uint8), tensor.reshape(-1).contiguous().view(torch.uint8))
    if tensor.dtype != torch.float8_e4m3fn:
        assert decoded.tolist() == tensor.tolist()


def test_single_tensor_handles_grad_and_owns_its_memory():
    leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    decoded = deserialize_single_tensor(serialize_single_tensor(leaf))
    assert decoded.tolist() == [1.0, 2.0] and not decoded.requires_grad
    source = torch.tensor([1, 2, 3])
    encoded = serialize_single_tensor(source)
    decoded = deserialize_single_tensor(encoded)
    decoded[0] = 99
    assert source[0].item() == 1  # the decoded tensor is a copy
    assert deserialize_single_tensor(("int64", (3,), bytes(encoded[2]))).tolist() == [1, 2, 3]


def test_single_tensor_errors():
    with pytest.raises(DataProtoTypeError, match="unknown dtype 'float99'"):
        deserialize_single_tensor(("float99", (1,), b"\x00"))
    with pytest.raises(DataProtoError, match=r"float32 tensor of shape \(2,\) needs 8 bytes, got 4"):
        deserialize_single_tensor(("float32", (2,), b"\x00" * 4))
    with pytest.raises(DataProtoTypeError, match="expects a torch.Tensor"):
        serialize_single_tensor(np.zeros(2))


def test_tensordict_round_trip_with_nested_tensors_and_keys():
    strided_nested = torch.nested.as_nested_tensor([torch.ones(2, 3), torch.zeros(3, 4), torch.full((1, 5), 2.0)])
    jagged = torch.nested.as_nested_tensor(
        [torch.arange(2.0), torch.arange(4.0), torch.arange(1.0)], layout=torch.jagged
    )
    td = TensorDict(
        {"nested": strided_nested, "jagged": jagged, "regular": torch.arange(60.0).reshape(3, 4, 5)}, batch_size=[3]
    )
    td["sub", "ids"] = torch.tensor([4, 5, 6], dtype=torch.int16)
    batch_size, device, items = serialize_tensordict(td)
    assert batch_size == (3,) and device is None
    assert items["nested"][0] == "strided" and items["jagged"][0] == "jagged" and len(items["regular"]) == 3
    back = deserialize_tensordict(pickle.loads(pickle.dumps((batch_size, device, items))))
    assert tuple(back.batch_size) == (3,)
    assert torch.equal(back["regular"], td["regular"]) and back["sub", "ids"].dtype == torch.int16
    for key in ("nested", "jagged"):
        assert back[key].is_nested and back[key].layout == td[key].layout
        assert [t.tolist() for t in back[key].unbind()] == [t.tolist() for t in td[key].unbind()]


def test_tensordict_keeps_batch_dims_and_cpu_device():
    td = TensorDict({"a": torch.randn(2, 3, 4)}, batch_size=[2, 3], device="cpu")
    encoded = serialize_tensordict(td)
    assert encoded[:2] == ((2, 3), "cpu")
    back = deserialize_tensordict(encoded)
    assert tuple(back.batch_size) == (2, 3) and back.device == torch.device("cpu")
    assert torch.equal(back["a"], td["a"])
    with pytest.raises(DataProtoError, match="expected a 2- or 3-tuple, got length 1"):
        deserialize_tensordict(((2,), None, {"a": ("x",)}))


def test_dataproto_pickles_with_verls_numpy_method(monkeypatch):
    data = DataProto.from_dict(
        tensors={
            "ids": torch.arange(8).reshape(4, 2),
            "logp": torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.bfloat16),
        },
        non_tensors={"uid": ["a", "b", "c", "d"]},
        meta_info={"t": 1},
    )
    piece = data.chunk(2)[1]
    monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "numpy")
    payload = pickle.dumps(piece)
    assert piece.__getstate__()["batch"][0] == (2,)  # the batch travels as serialize_tensordict output
    monkeypatch.delenv("VERL_DATAPROTO_SERIALIZATION_METHOD")  # the receiver needs no setting
    back = pickle.loads(payload)
    assert back.batch["ids"].tolist() == [[4, 5], [6, 7]] and back.batch["logp"].dtype == torch.bfloat16
    assert back.batch["logp"].tolist() == [2.0, 0.0]
    assert back.non_tensor_batch["uid"].tolist() == ["c", "d"] and back.meta_info == {"t": 1}
    empty = DataProto(batch=TensorDict({}, batch_size=[3]))
    monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "numpy")
    assert len(pickle.loads(pickle.dumps(empty))) == 3
    monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "msgpack")
    with pytest.raises(DataProtoError, match="VERL_DATAPROTO_SERIALIZATION_METHOD='msgpack' is not supported"):
        pickle.dumps(piece)
