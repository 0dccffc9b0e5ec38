"""Device placement: ops keep the batch on its accelerator; pickling restores it (skipped without one)."""

from __future__ import annotations

import pickle

import pytest
import torch

from verl.protocol import DataProto, pad_dataproto_to_divisor

accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(accelerator is None, reason="needs an accelerator (CUDA/ROCm/NPU/XPU)"),
]


def test_ops_keep_the_accelerator_device():
    data = DataProto.from_dict(tensors={"x": torch.arange(6)}, non_tensors={"uid": list("abcdef")}).to(accelerator)
    assert data.batch["x"].device.type == accelerator.type
    for out in (
        data[torch.tensor([5, 0])],
        data[data.batch["x"] > 2],  # a mask living on the accelerator
        data.repeat(2),
        DataProto.concat(data.chunk(3)),
        pad_dataproto_to_divisor(data, 4)[0],
        pickle.loads(pickle.dumps(data)),
    ):
        assert out.batch["x"].device.type == accelerator.type
        assert out.batch["x"].cpu().tolist() == [int(u, 16) - 10 for u in out.non_tensor_batch["uid"]]
    assert data[data.batch["x"] > 2].non_tensor_batch["uid"].tolist() == ["d", "e", "f"]
    assert data.to("cpu").batch["x"].device.type == "cpu"


def test_codec_tensordict_io_and_folding_keep_the_accelerator_device(monkeypatch):
    from verl.protocol import deserialize_single_tensor, fold_batch_dim, serialize_single_tensor, unfold_batch_dim

    data = DataProto.from_dict(tensors={"x": torch.arange(6)}, non_tensors={"uid": list("abcdef")}).to(accelerator)
    dtype, shape, raw = serialize_single_tensor(data.batch["x"])  # device memory is copied to the host
    assert deserialize_single_tensor((dtype, shape, raw)).tolist() == list(range(6))
    monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "numpy")
    for out in (
        pickle.loads(pickle.dumps(data)),
        DataProto.from_tensordict(data.to_tensordict()),
        unfold_batch_dim(fold_batch_dim(data, 2)),
        data.unfold_column_chunks(2),
    ):
        assert out.batch["x"].device.type == accelerator.type
        assert out.batch["x"].cpu().tolist() == [int(u, 16) - 10 for u in out.non_tensor_batch["uid"]]
