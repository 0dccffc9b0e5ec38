"""Each dispatch mode through LocalWorkerGroup, against hand-computed expectations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.controller import ClassWithInitArgs, Dispatch, DispatchError, LocalWorkerGroup, Worker, register
from verl.protocol import DataProto


class EchoWorker(Worker):
    """Methods return rank * 10 + len(arg) (or row data tagged with the rank) so results reveal the routing."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def one_to_all(self, data, extra=()):
        return self.rank * 10 + len(data) + len(extra)

    @register()  # ALL_TO_ALL, Execute.ALL
    def all_to_all(self, x):
        return (self.rank, x)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero(self, data):
        return self.rank * 10 + len(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def dp_compute(self, data, scale=1):
        return (self.rank * 10 + len(data)) * scale

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def tag_rows(self, data: DataProto, offset: int = 0) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            tensors={"ids": data.batch["ids"].clone(), "doubled": data.batch["ids"] * 2 + offset},
            non_tensors={"name": data.non_tensor_batch["name"].copy(), "rank": np.full(n, self.rank)},
            meta_info={"metrics": {"rows": [n]}},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def returns_none(self, data: DataProto):
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def duplicate_rows(self, data: DataProto) -> DataProto:
        return data.repeat(2)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metric(self, data: DataProto, label: str = "m"):
        return {"label": label, "rank": self.rank, "ids": data.batch["ids"].tolist()}


def group(world_size: int) -> LocalWorkerGroup:
    return LocalWorkerGroup(ClassWithInitArgs(EchoWorker), world_size=world_size)


def batch(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"ids": torch.arange(100, 100 + n)},
        non_tensors={"name": np.array([f"row{i}" for i in range(n)], dtype=object)},
    )


def test_one_to_all_replicates_and_returns_list():
    wg = group(3)
    # len("abcd") = 4 everywhere; rank r returns 10r + 4 (+2 for the kwarg tuple).
    assert wg.one_to_all("abcd") == [4, 14, 24]
    assert wg.one_to_all("abcd", extra=(1, 2)) == [6, 16, 26]


def test_one_to_all_list_argument_is_not_scattered():
    wg = group(2)
    # a list of length world_size is replicated whole, not split.
    assert wg.one_to_all([7, 8]) == [2, 12]


def test_all_to_all_scatters_per_rank_lists_and_broadcasts_others():
    wg = group(2)
    assert wg.all_to_all(["a", "b"]) == [(0, "a"), (1, "b")]
    assert wg.all_to_all("x") == [(0, "x"), (1, "x")]
    assert wg.all_to_all([1, 2, 3]) == [(0, [1, 2, 3]), (1, [1, 2, 3])]


def test_rank_zero_runs_once_and_returns_its_value():
    wg = group(4)
    calls = []
    for w in wg.workers:
        w.rank_zero = lambda data, _w=w: calls.append(_w.rank) or _w.rank * 10 + len(data)
    assert wg.rank_zero([1, 2, 3]) == 3  # rank 0: 0 * 10 + 3, the list is not scattered
    assert calls == [0]


def test_dp_compute_hands_element_i_to_rank_i():
    wg = group(3)
    assert wg.dp_compute(["a", "bb", "ccc"]) == [1, 12, 23]
    assert wg.dp_compute(["a", "bb", "ccc"], scale=[1, 2, 3]) == [1, 24, 69]


def test_dp_compute_wrong_length_names_argument_and_lengths():
    wg = group(3)
    with pytest.raises(DispatchError, match=r"positional argument 0 has length 2, expected world_size=3"):
        wg.dp_compute(["a", "b"])
    with pytest.raises(DispatchError, match=r"keyword argument 'scale' has length 4, expected world_size=3"):
        wg.dp_compute(["a", "b", "c"], scale=[1, 2, 3, 4])


def test_dp_compute_non_list_names_argument_and_type():
    with pytest.raises(DispatchError, match=r"positional argument 0 is a str, expected a list"):
        group(2).dp_compute("ab")


@pytest.mark.parametrize(
    ("world_size", "expected_ranks"),
    [
        # 5 rows, world 2: padded to 6 = rows [0,1,2,3,4,0]; chunks of 3 -> rows 0-2 on rank 0, 3-4 on rank 1.
        (2, [0, 0, 0, 1, 1]),
        # world 8: padded to 8 = rows [0,1,2,3,4,0,1,2]; one row per rank.
        (8, [0, 1, 2, 3, 4]),
        # world 5 divides 5: no padding.
        (5, [0, 1, 2, 3, 4]),
        (1, [0, 0, 0, 0, 0]),
    ],
)
def test_dp_compute_proto_uneven_batch_keeps_exactly_the_input_rows(world_size, expected_ranks):
    out = group(world_size).tag_rows(batch(5), offset=1)
    assert len(out) == 5
    assert out.batch["ids"].tolist() == [100, 101, 102, 103, 104]
    assert out.batch["doubled"].tolist() == [201, 203, 205, 207, 209]
    assert list(out.non_tensor_batch["name"]) == ["row0", "row1", "row2", "row3", "row4"]
    assert list(out.non_tensor_batch["rank"]) == expected_ranks


def test_dp_compute_proto_gathers_meta_info_metrics_from_every_rank():
    out = group(2).tag_rows(batch(5))
    # Each rank reports its padded chunk size (3 rows); concat gathers them in rank order.
    assert out.meta_info["metrics"] == {"rows": [3, 3]}


def test_dp_compute_proto_does_not_modify_the_input():
    data = batch(5)
    group(8).tag_rows(data)
    assert len(data) == 5
    assert data.batch["ids"].tolist() == [100, 101, 102, 103, 104]


def test_dp_compute_metric_returns_per_rank_list_including_padding_rows():
    # 5 rows on world 2: rank 0 gets rows 0-2, rank 1 gets rows 3, 4 and the padding copy of row 0.
    assert group(2).metric(batch(5), label="x") == [
        {"label": "x", "rank": 0, "ids": [100, 101, 102]},
        {"label": "x", "rank": 1, "ids": [103, 104, 100]},
    ]


def test_dp_compute_metric_small_batch_cycles_leading_rows():
    # K11: 2 rows over 8 ranks -> padded rows cycle [0, 1, 0, 1, 0, 1, 0, 1].
    result = group(8).metric(batch(2))
    assert [m["ids"] for m in result] == [[100], [101], [100], [101], [100], [101], [100], [101]]


def test_dp_compute_proto_needs_a_data_proto():
    with pytest.raises(DispatchError, match=r"needs at least one DataProto.*positional argument 0: list"):
        group(2).tag_rows([1, 2])


def test_dp_compute_proto_rejects_data_protos_of_different_lengths():
    with pytest.raises(DispatchError, match=r"same number of rows"):
        group(2).metric(batch(3), label=batch(4))


def test_dp_compute_proto_non_data_proto_output_points_to_metric_mode():
    with pytest.raises(DispatchError, match=r"rank 0 returned a NoneType.*DP_COMPUTE_METRIC"):
        group(2).returns_none(batch(4))


def test_dp_compute_proto_refuses_to_unpad_when_workers_change_row_count():
    # No padding needed: the doubled rows are returned as they are (2 + 2 per rank, ranks in order).
    assert group(2).duplicate_rows(batch(4)).batch["ids"].tolist() == [100, 100, 101, 101, 102, 102, 103, 103]
    with pytest.raises(DispatchError, match=r"returned 12 rows in total for 6 padded input rows"):
        group(2).duplicate_rows(batch(5))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(min_value=1, max_value=23), world_size=st.integers(min_value=1, max_value=9))
def test_dp_compute_proto_property_rows_and_owners(rows, world_size):
    out = group(world_size).tag_rows(batch(rows))
    assert out.batch["ids"].tolist() == list(range(100, 100 + rows))
    per_rank = -(-rows // world_size)  # ceil: chunk size after padding to a multiple of world_size
    assert list(out.non_tensor_batch["rank"]) == [i // per_rank for i in range(rows)]
