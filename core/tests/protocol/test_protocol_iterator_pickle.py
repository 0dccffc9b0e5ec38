"""make_iterator (verl/protocol.py) and pickling / save_to_disk round trips."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from verl.protocol import DataProto, DataProtoError, DataProtoTypeError


def make(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"ids": torch.arange(n) * 10, "h": torch.randn(n, 3, dtype=torch.float64)},
        non_tensors={"uid": [f"u{r}" for r in range(n)], "level": np.arange(n, dtype=np.int8)},
        meta_info={"mb": "meta"},
    )


def row_ids(data: DataProto) -> list[int]:
    ids = (data.batch["ids"] // 10).tolist()
    assert data.non_tensor_batch["uid"].tolist() == [f"u{r}" for r in ids]
    assert data.non_tensor_batch["level"].tolist() == ids
    return ids


def test_iterator_in_order_without_shuffle():
    batches = list(make(6).make_iterator(mini_batch_size=2, epochs=2))
    assert [row_ids(b) for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    assert all(b.meta_info == {"mb": "meta"} for b in batches)
    assert batches[0].non_tensor_batch["level"].dtype == np.int8


def test_iterator_seeded_shuffle_matches_torch_dataloader():
    n, mb, seed, epochs = 12, 4, 7, 3
    # Independent oracle: the row order verl gets from DataLoader(shuffle=True, generator=seeded).
    generator = torch.Generator()
    generator.manual_seed(seed)
    loader = DataLoader(list(range(n)), batch_size=mb, shuffle=True, generator=generator)
    expected = [batch.tolist() for _ in range(epochs) for batch in loader]
    got = [row_ids(b) for b in make(n).make_iterator(mb, epochs, seed=seed, dataloader_kwargs={"shuffle": True})]
    assert got == expected
    # every epoch is a permutation and epochs differ
    per_epoch = [sorted(sum(got[i * 3 : i * 3 + 3], [])) for i in range(epochs)]
    assert per_epoch == [list(range(n))] * epochs
    assert got[:3] != got[3:6]


def test_iterator_same_seed_same_order_and_lazy_error_checks():
    data = make(8)
    first = [row_ids(b) for b in data.make_iterator(4, 2, seed=1, dataloader_kwargs={"shuffle": True})]
    second = [row_ids(b) for b in data.make_iterator(4, 2, seed=1, dataloader_kwargs={"shuffle": True})]
    assert first == second
    with pytest.raises(DataProtoError, match=r"10 rows are not divisible by mini_batch_size=4 \(10 % 4 = 2\)"):
        make(10).make_iterator(4, 1)  # raised at call time, before iterating
    with pytest.raises(DataProtoTypeError, match="num_workers"):
        data.make_iterator(4, 1, dataloader_kwargs={"num_workers": 2})
    assert list(data.make_iterator(4, 0)) == []


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b)
    assert set(a.batch.keys()) == set(b.batch.keys())
    for key in a.batch.keys():
        assert a.batch[key].dtype == b.batch[key].dtype and torch.equal(a.batch[key], b.batch[key])
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for key, value in a.non_tensor_batch.items():
        assert value.dtype == b.non_tensor_batch[key].dtype and value.shape == b.non_tensor_batch[key].shape
        assert value.tolist() == b.non_tensor_batch[key].tolist()
    assert a.meta_info == b.meta_info


def test_pickle_round_trip_exact():
    data = make(4)
    data.batch["bf16"] = torch.tensor([1.5, -2.0, 0.0, 3.25], dtype=torch.bfloat16)
    data.non_tensor_batch["obj"] = np.array([{"a": [1]}, None, (1, 2), "s"], dtype=object)
    data.meta_info["metrics"] = {"loss": [0.1]}
    out = pickle.loads(pickle.dumps(data))
    assert type(out) is DataProto
    assert_same(data, out)
    assert out.batch["bf16"].dtype == torch.bfloat16
    assert out.non_tensor_batch["obj"][0] == {"a": [1]} and out.non_tensor_batch["obj"][2] == (1, 2)
    deep = copy.deepcopy(data)
    assert_same(data, deep)
    deep.batch["ids"][0] = -1
    assert data.batch["ids"][0] == 0


def test_pickle_without_batch_and_empty():
    only_np = DataProto.from_dict(non_tensors={"u": ["a", "b"]}, meta_info={"k": 1})
    out = pickle.loads(pickle.dumps(only_np))
    assert out.batch is None and out.non_tensor_batch["u"].tolist() == ["a", "b"] and out.meta_info == {"k": 1}
    assert len(pickle.loads(pickle.dumps(DataProto()))) == 0


def test_pickled_chunk_does_not_carry_the_parent_storage():
    big = DataProto.from_dict(tensors={"x": torch.zeros(1024, 256)})
    whole = len(pickle.dumps(big))
    piece = len(pickle.dumps(big.chunk(8)[3]))
    assert piece < whole / 4  # without compaction torch.save would write all 1 MiB for each piece


def test_save_and_load_from_disk(tmp_path):
    data = make(3)
    path = tmp_path / "data.pkl"
    data.save_to_disk(path)
    assert_same(data, DataProto.load_from_disk(path))
    (tmp_path / "other.pkl").write_bytes(pickle.dumps([1]))
    with pytest.raises(DataProtoTypeError, match="not a DataProto"):
        DataProto.load_from_disk(tmp_path / "other.pkl")


def test_copy_is_shallow():
    data = make(2)
    dup = copy.copy(data)
    dup.meta_info["x"] = 1
    dup.batch["new"] = torch.zeros(2)
    assert "x" not in data.meta_info and "new" not in data.batch.keys()
    assert dup.batch["ids"].data_ptr() == data.batch["ids"].data_ptr()
