"""Property-based tests (hypothesis) for the row algebra of DataProto.

Expected values come from plain numpy index arithmetic on the original arrays (np.repeat / np.tile /
modulo), never from the DataProto methods under test.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.protocol import AUTO_PADDING_KEY, DataProto, pad_dataproto_to_divisor, unpad_dataproto

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)

TORCH_DTYPES = [torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.bool]


@st.composite
def dataprotos(draw, min_rows: int = 0, max_rows: int = 12, with_batch: bool | None = None) -> DataProto:
    n = draw(st.integers(min_rows, max_rows))
    has_batch = draw(st.booleans()) if with_batch is None else with_batch
    tensors = {}
    if has_batch:
        for i in range(draw(st.integers(1, 3))):
            dtype = draw(st.sampled_from(TORCH_DTYPES))
            tail = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
            values = np.asarray(
                draw(st.lists(st.integers(-50, 50), min_size=n * math.prod(tail), max_size=n * math.prod(tail)))
            )
            tensors[f"t{i}"] = torch.from_numpy(values.reshape((n, *tail))).to(dtype)
        tensors["row"] = torch.arange(n)
    non_tensors = {
        "uid": np.array([f"u{r}" for r in range(n)], dtype=object),
        "obj": np.fromiter(
            (draw(st.one_of(st.none(), st.text(max_size=3), st.lists(st.integers(), max_size=2))) for _ in range(n)),
            dtype=object,
            count=n,
        ),
        "f": np.asarray(
            draw(st.lists(st.floats(allow_infinity=False), min_size=n, max_size=n)), dtype=np.float64
        ).reshape(n),
    }
    meta = {"temperature": draw(st.floats(0.1, 2.0)), "tag": draw(st.text(max_size=4))}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def expected_rows(data: DataProto, positions: np.ndarray) -> dict:
    """Every field of ``data`` gathered with plain numpy/torch indexing by ``positions``."""
    out = {}
    if data.batch is not None:
        for key, value in data.batch.items():
            out[("batch", key)] = value[torch.from_numpy(positions)] if len(positions) else value[:0]
    for key, value in data.non_tensor_batch.items():
        out[("np", key)] = value[positions] if len(positions) else value[:0]
    return out


def assert_fields(actual: DataProto, expected: dict) -> None:
    actual_keys = set() if actual.batch is None else {("batch", k) for k in actual.batch.keys()}
    actual_keys |= {("np", k) for k in actual.non_tensor_batch}
    assert actual_keys == set(expected)
    for (kind, key), value in expected.items():
        got = actual.batch[key] if kind == "batch" else actual.non_tensor_batch[key]
        assert got.dtype == value.dtype and tuple(got.shape) == tuple(value.shape), key
        if kind == "batch":
            assert torch.equal(got, value), key
        elif value.dtype == object:
            assert got.tolist() == value.tolist(), key
        else:
            np.testing.assert_array_equal(got, value)


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b)
    assert_fields(b, expected_rows(a, np.arange(len(a))))
    assert a.meta_info == b.meta_info


@SETTINGS
@given(data=dataprotos(max_rows=4), chunks=st.integers(1, 5))
def test_chunk_then_concat_is_identity(data, chunks):
    data = data.repeat(chunks)  # a multiple of chunks rows
    pieces = data.chunk(chunks)
    assert len(pieces) == chunks and {len(p) for p in pieces} == {len(data) // chunks}
    assert_same(data, DataProto.concat(pieces))


@SETTINGS
@given(data=dataprotos(), chunks=st.integers(1, 15))
def test_chunk_with_auto_padding_keeps_every_row_once(data, chunks):
    data.meta_info[AUTO_PADDING_KEY] = True
    pieces = data.chunk(chunks)
    assert len(pieces) == chunks
    # verl's sizes are torch.chunk's (TensorDict.chunk); where torch.chunk makes fewer pieces, empty ones follow.
    torch_sizes = [len(piece) for piece in torch.arange(len(data)).chunk(chunks)] if len(data) else []
    assert [len(p) for p in pieces] == torch_sizes + [0] * (chunks - len(torch_sizes))
    assert_same(data, DataProto.concat(pieces))


@SETTINGS
@given(data=dataprotos(), split_size=st.integers(1, 15))
def test_split_sizes_sum_and_order(data, split_size):
    pieces = data.split(split_size)
    n = len(data)
    assert len(pieces) == -(-n // split_size)
    assert sum(len(p) for p in pieces) == n
    assert all(len(p) == split_size for p in pieces[:-1])
    if pieces:
        assert 1 <= len(pieces[-1]) <= split_size
        assert_same(data, DataProto.concat(pieces))
    start = 0
    for piece in pieces:
        assert_fields(piece, expected_rows(data, np.arange(start, start + len(piece))))
        start += len(piece)


@SETTINGS
@given(data=dataprotos(), repeat_times=st.integers(1, 4), interleave=st.booleans())
def test_repeat_aligns_every_field(data, repeat_times, interleave):
    out = data.repeat(repeat_times=repeat_times, interleave=interleave)
    base = np.arange(len(data))
    positions = np.repeat(base, repeat_times) if interleave else np.tile(base, repeat_times)
    assert len(out) == len(data) * repeat_times
    assert_fields(out, expected_rows(data, positions))
    assert out.meta_info == data.meta_info


@SETTINGS
@given(data=dataprotos(), seed=st.integers(0, 2**16))
def test_sample_level_repeat_matches_numpy(data, seed):
    counts = np.random.default_rng(seed).integers(0, 4, size=len(data))
    out = data.sample_level_repeat(counts)
    assert_fields(out, expected_rows(data, np.repeat(np.arange(len(data)), counts)))


@SETTINGS
@given(data=dataprotos(min_rows=1), divisor=st.integers(1, 40))
def test_pad_unpad_round_trip_for_any_divisor(data, divisor):
    n = len(data)
    padded, pad_size = pad_dataproto_to_divisor(data, divisor)
    assert len(padded) % divisor == 0 and 0 <= pad_size < divisor and len(padded) == n + pad_size
    assert_fields(padded, expected_rows(data, np.arange(n + pad_size) % n))
    assert len(padded.chunk(divisor)) == divisor
    assert_same(data, unpad_dataproto(padded, pad_size))


@SETTINGS
@given(data=dataprotos(), metrics=st.none() | st.dictionaries(st.text(max_size=3), st.floats(allow_nan=False)))
def test_pickle_round_trip(data, metrics):
    if metrics is not None:
        data.meta_info["metrics"] = metrics
    assert_same(data, pickle.loads(pickle.dumps(data)))
    for piece in data.split(5):
        assert_same(piece, pickle.loads(pickle.dumps(piece)))


@SETTINGS
@given(data=dataprotos(), seed=st.integers(0, 2**16))
def test_reorder_and_mask_match_numpy(data, seed):
    rng = np.random.default_rng(seed)
    permutation = rng.permutation(len(data))
    mask = rng.random(len(data)) < 0.5
    assert_fields(data[mask], expected_rows(data, np.flatnonzero(mask)))
    original = expected_rows(data, permutation)
    data.reorder(torch.from_numpy(permutation))
    assert_fields(data, original)
