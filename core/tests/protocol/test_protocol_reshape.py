"""chunk / split / concat / repeat / sample_level_repeat / padding / pad helpers / collate (verl/protocol.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from verl.protocol import (
    AUTO_PADDING_KEY,
    DataProto,
    DataProtoError,
    DataProtoSizeError,
    DataProtoTypeError,
    collate_fn,
    merge_meta_info,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)


def make(n: int, meta: dict | None = None) -> DataProto:
    """Row r: ids = [r, 100 + r] (int64), logp = -r (float32), uid = f"u{r}" (object), level = r (int16)."""
    return DataProto.from_dict(
        tensors={
            "ids": torch.tensor([[r, 100 + r] for r in range(n)], dtype=torch.int64).reshape(n, 2),
            "logp": torch.tensor([-float(r) for r in range(n)], dtype=torch.float32),
        },
        non_tensors={"uid": [f"u{r}" for r in range(n)], "level": np.arange(n, dtype=np.int16)},
        meta_info=dict(meta or {"temperature": 1.0}),
    )


def rows(data: DataProto) -> list[int]:
    ids = data.batch["ids"][:, 0].tolist()
    assert data.batch["ids"][:, 1].tolist() == [100 + r for r in ids]
    assert data.batch["logp"].tolist() == [-float(r) for r in ids]
    assert data.non_tensor_batch["uid"].tolist() == [f"u{r}" for r in ids]
    assert data.non_tensor_batch["level"].tolist() == ids
    assert data.non_tensor_batch["level"].dtype == np.int16 and data.batch["logp"].dtype == torch.float32
    return ids


# ------------------------------------------------------------------------------------------------ chunk
def test_chunk_equal_pieces_are_views_with_meta_copies():
    data = make(6)
    pieces = data.chunk(3)
    assert [rows(p) for p in pieces] == [[0, 1], [2, 3], [4, 5]]
    assert all(p.meta_info == {"temperature": 1.0} for p in pieces)
    pieces[1].batch["logp"][0] = 42.0
    assert data.batch["logp"][2].item() == 42.0
    pieces[0].meta_info["x"] = 1
    assert "x" not in data.meta_info and "x" not in pieces[1].meta_info


def test_chunk_uneven_error_names_sizes():
    with pytest.raises(DataProtoError, match=r"cannot chunk a DataProto of 5 rows into 2 equal chunks \(5 % 2 = 1\)"):
        make(5).chunk(2)
    with pytest.raises(DataProtoError, match="chunks must be >= 1"):
        make(4).chunk(0)
    with pytest.raises(DataProtoTypeError):
        make(4).chunk(2.0)


def test_chunk_uneven_with_auto_padding_follows_verl_sizes():
    # verl (TensorDict.chunk = torch.chunk): pieces of ceil(10 / 4) = 3 rows, the last one gets 10 - 9 = 1.
    data = make(10, meta={AUTO_PADDING_KEY: True})
    pieces = data.chunk(4)
    assert [rows(p) for p in pieces] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(p.meta_info == data.meta_info for p in pieces)
    # 7 into 3: ceil = 3 -> [3, 3, 1]; 5 into 4: ceil = 2 -> [2, 2, 1] fills only 3 pieces (verl fails), the 4th is empty.
    assert [len(p) for p in make(7, meta={AUTO_PADDING_KEY: True}).chunk(3)] == [3, 3, 1]
    assert [rows(p) for p in make(5, meta={AUTO_PADDING_KEY: True}).chunk(4)] == [[0, 1], [2, 3], [4], []]
    assert [len(p) for p in make(2, meta={AUTO_PADDING_KEY: True}).chunk(3)] == [1, 1, 0]


def test_chunk_uneven_without_batch_uses_the_same_sizes():
    # verl splits a batch-less DataProto with np.array_split ([3, 3, 2, 2] here); one rule for both is kept.
    data = DataProto.from_dict(non_tensors={"u": list("abcdefghij")}, auto_padding=True)
    assert ["".join(p.non_tensor_batch["u"]) for p in data.chunk(4)] == ["abc", "def", "ghi", "j"]


def test_uneven_chunk_error_is_an_assertion_error_like_verls_assert():
    with pytest.raises(AssertionError, match="cannot chunk a DataProto of 6 rows into 5 equal chunks"):
        make(6).chunk(5)
    with pytest.raises(DataProtoSizeError):
        make(6).chunk(4)


def test_chunk_without_batch():
    data = DataProto.from_dict(non_tensors={"u": ["a", "b", "c", "d"]})
    assert [p.non_tensor_batch["u"].tolist() for p in data.chunk(2)] == [["a", "b"], ["c", "d"]]
    assert all(p.batch is None for p in data.chunk(2))


# ------------------------------------------------------------------------------------------------ split
@pytest.mark.parametrize(("n", "size", "sizes"), [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (3, 5, [3]), (0, 2, [])])
def test_split_sizes(n, size, sizes):
    pieces = make(n).split(size)
    assert [len(p) for p in pieces] == sizes
    assert [r for p in pieces for r in rows(p)] == list(range(n))


def test_split_rejects_bad_size():
    with pytest.raises(DataProtoError, match="split_size must be >= 1"):
        make(3).split(0)


# ----------------------------------------------------------------------------------------------- concat
def test_concat_joins_in_order():
    data = make(7)
    out = DataProto.concat([data[0:2], data[2:3], data[3:3], data[3:7]])
    assert rows(out) == list(range(7))
    assert out.meta_info == {"temperature": 1.0}


def test_concat_merges_metrics_and_checks_other_keys():
    parts = [make(1, {"t": 1, "metrics": {"loss": 0.5, "lr": [1e-3]}}), make(1, {"t": 1, "metrics": {"loss": 0.25}})]
    parts.append(make(1, {"t": 1, "metrics": [{"loss": 0.125, "acc": [1.0, 0.0]}]}))
    parts.append(make(1, {"t": 1, "metrics": None}))
    parts.append(make(1, {"extra": "only-here"}))
    out = DataProto.concat(parts)
    assert out.meta_info == {
        "t": 1,
        "extra": "only-here",
        "metrics": {"loss": [0.5, 0.25, 0.125], "lr": [1e-3], "acc": [1.0, 0.0]},
    }
    assert "metrics" not in DataProto.concat([make(1), make(1)]).meta_info
    with pytest.raises(
        DataProtoError, match=r"Conflicting values for meta_info key 't' in concat: part 0 has 1, part 1 has 2"
    ):
        DataProto.concat([make(1, {"t": 1}), make(1, {"t": 2})])


def test_merge_meta_info_rejects_bad_metrics():
    with pytest.raises(DataProtoTypeError, match=r"metrics'\] of part 1"):
        merge_meta_info([{"metrics": {}}, {"metrics": 3}])


def test_concat_errors_name_keys_and_parts():
    with pytest.raises(DataProtoError, match="at least one"):
        DataProto.concat([])
    a, b = make(2), make(2)
    b.pop(non_tensor_batch_keys=["uid"])
    with pytest.raises(DataProtoError, match=r"part 1 has different non_tensor_batch keys.*missing \['uid'\]"):
        DataProto.concat([a, b])
    c = make(2)
    c.batch["logp"] = c.batch["logp"].double()
    with pytest.raises(DataProtoError, match=r"batch\['logp'\] has different dtypes"):
        DataProto.concat([make(2), c])
    d = make(2)
    d.rename("logp", "other")
    with pytest.raises(DataProtoError, match=r"part 1 has different batch keys.*extra \['other'\]"):
        DataProto.concat([make(2), d])
    with pytest.raises(DataProtoError, match="part 1 has a batch but part 0 has none"):
        DataProto.concat(
            [
                DataProto.from_dict(non_tensors={"u": [1]}),
                DataProto.from_dict(tensors={"x": torch.ones(1)}, non_tensors={"u": [1]}),
            ]
        )
    with pytest.raises(DataProtoTypeError, match="element 1"):
        DataProto.concat([make(1), "x"])


def test_concat_keeps_subclass():
    class MyProto(DataProto):
        pass

    part = MyProto.from_dict(tensors={"x": torch.ones(2)})
    assert type(DataProto.concat([part, part])) is MyProto


# ----------------------------------------------------------------------------------------------- repeat
def test_repeat_interleave_and_tile():
    data = make(3)
    assert rows(data.repeat(2)) == [0, 0, 1, 1, 2, 2]
    assert rows(data.repeat(repeat_times=2, interleave=False)) == [0, 1, 2, 0, 1, 2]
    assert rows(data.repeat(1)) == [0, 1, 2]
    assert data.repeat(3).meta_info == data.meta_info
    with pytest.raises(DataProtoError, match="repeat_times must be >= 1"):
        data.repeat(0)


def test_repeat_multidim_non_tensor():
    data = DataProto.from_dict(non_tensors={"pair": np.array([[1, 2], [3, 4]])})
    assert data.repeat(2).non_tensor_batch["pair"].tolist() == [[1, 2], [1, 2], [3, 4], [3, 4]]
    assert data.repeat(2, interleave=False).non_tensor_batch["pair"].tolist() == [[1, 2], [3, 4], [1, 2], [3, 4]]


def test_repeat_nested_tensordict():
    td = TensorDict({"outer": {"inner": torch.tensor([[1], [2]])}}, batch_size=[2])
    out = DataProto(batch=td).repeat(2)
    assert out.batch["outer", "inner"].flatten().tolist() == [1, 1, 2, 2]


@pytest.mark.parametrize("counts", [[2, 0, 1], (2, 0, 1), np.array([2, 0, 1]), torch.tensor([2, 0, 1])])
def test_sample_level_repeat(counts):
    assert rows(make(3).sample_level_repeat(counts)) == [0, 0, 2]


def test_sample_level_repeat_errors():
    with pytest.raises(DataProtoError, match="repeat_times has 2 entries but the DataProto has 3 rows"):
        make(3).sample_level_repeat([1, 1])
    with pytest.raises(DataProtoError, match=">= 0"):
        make(2).sample_level_repeat([1, -1])
    with pytest.raises(DataProtoTypeError):
        make(2).sample_level_repeat(2)
    with pytest.raises(DataProtoError, match="1-D integers"):
        make(2).sample_level_repeat([1.5, 1.0])


# ---------------------------------------------------------------------------------------------- padding
def test_padding_last_and_first():
    data = make(3)
    assert data.padding(2) is None
    assert rows(data) == [0, 1, 2, 2, 2]
    data = make(3)
    data.padding(1, padding_candidate="first")
    assert rows(data) == [0, 1, 2, 0]
    data.padding(0)
    assert len(data) == 4


def test_padding_errors():
    with pytest.raises(DataProtoError, match="padding_candidate"):
        make(2).padding(1, "middle")
    with pytest.raises(DataProtoError, match="empty DataProto"):
        make(0).padding(1)


@pytest.mark.parametrize(
    ("n", "divisor", "expected_rows", "pad"),
    [(5, 4, [0, 1, 2, 3, 4, 0, 1, 2], 3), (4, 4, [0, 1, 2, 3], 0), (3, 1, [0, 1, 2], 0), (1, 3, [0, 0, 0], 2)],
)
def test_pad_dataproto_to_divisor(n, divisor, expected_rows, pad):
    data = make(n, {"metrics": {"x": 1.0}})
    padded, pad_size = pad_dataproto_to_divisor(data, divisor)
    assert pad_size == pad and rows(padded) == expected_rows
    assert padded.meta_info == {"metrics": {"x": 1.0}}  # meta untouched (no concat-style metrics merge)
    assert rows(unpad_dataproto(padded, pad_size)) == list(range(n))


def test_pad_helpers_edge_cases(caplog):
    empty = make(0)
    with caplog.at_level("WARNING"):
        padded, pad_size = pad_dataproto_to_divisor(empty, 4)
    assert padded is empty and pad_size == 0 and "no rows" in caplog.text
    with pytest.raises(DataProtoError, match="size_divisor must be >= 1"):
        pad_dataproto_to_divisor(make(2), 0)
    with pytest.raises(DataProtoTypeError):
        pad_dataproto_to_divisor({"x": 1}, 2)
    with pytest.raises(DataProtoError, match="cannot unpad 3 rows from a DataProto of 2 rows"):
        unpad_dataproto(make(2), 3)
    assert len(unpad_dataproto(make(2), 2)) == 0


# ---------------------------------------------------------------------------------------------- collate
def test_collate_fn_rebuilds_rows():
    data = make(3)
    out = collate_fn([data[2], data[0]])
    assert rows(out) == [2, 0]
    assert out.non_tensor_batch["uid"].dtype == object
    with pytest.raises(DataProtoError):
        collate_fn([])


def test_concat_keeps_the_slowest_parts_timing_per_stage() -> None:
    # Parts computed in parallel on two ranks: the stage took as long as its slowest rank.
    a = DataProto.from_dict(tensors={"x": torch.zeros(1)}, meta_info={"timing": {"gen": 1.5, "only_a": 0.2}})
    b = DataProto.from_dict(tensors={"x": torch.ones(1)}, meta_info={"timing": {"gen": 2.25}})
    merged = DataProto.concat([a, b])
    assert merged.meta_info["timing"] == {"gen": 2.25, "only_a": 0.2}
