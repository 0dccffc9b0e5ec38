"""Dispatch and collect functions of the built-in dispatch modes (verl semantics).

Contract shared with custom modes (``register(dispatch_mode={"dispatch_fn": ..., "collect_fn": ...})``):

* ``dispatch_fn(worker_group, *args, **kwargs) -> (args, kwargs)`` turns the driver's call arguments into
  the arguments handed to :meth:`WorkerGroup.execute_all`. A mode that gives each rank its own value
  returns every argument as a list of length ``world_size`` (element ``i`` goes to rank ``i``). A mode may
  add the scalar kwarg :data:`PADDING_SIZE_KWARG`: the group pops it before execution and removes that
  many trailing rows from the collected :class:`~verl.protocol.DataProto`.
* ``collect_fn(worker_group, output)`` turns the list of per-rank outputs (in rank order) into the value
  the driver-side method returns. With ``Execute.RANK_ZERO`` it receives rank 0's output alone.

Source: verl/single_controller/base/decorator.py. ``verl.protocol`` (torch, tensordict) is imported only
by the DataProto modes, so importing this module stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl.controller.errors import DispatchError

if TYPE_CHECKING:  # pragma: no cover
    from verl.controller.worker_group import WorkerGroup

#: Reserved kwarg through which a dispatch function reports the number of padding rows it appended
#: (verl's ``_padding_size_key_x123d``). Never reaches a worker.
PADDING_SIZE_KWARG = "_padding_size_key_x123d"
#: Optional companion of :data:`PADDING_SIZE_KWARG`: the padded batch's total row count, so the group can
#: refuse to strip padding from an output whose row count the workers changed. Never reaches a worker.
PADDED_ROWS_KWARG = "_padded_rows_key_x123d"


def _describe(value: Any) -> str:
    return type(value).__name__


# --- ONE_TO_ALL / ALL_TO_ALL / RANK_ZERO ------------------------------------------------------------


def dispatch_one_to_all(worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Replicate every argument to every rank: each becomes ``[arg] * world_size`` (same object)."""
    n = worker_group.world_size
    return tuple([arg] * n for arg in args), {key: [value] * n for key, value in kwargs.items()}


def dispatch_all_to_all(worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Pass the arguments through unchanged (``execute_all`` then scatters or broadcasts them)."""
    return args, kwargs


def collect_all_to_all(worker_group: WorkerGroup, output: Any) -> Any:
    """Return the outputs unchanged: the per-rank list, or rank 0's value for rank-zero execution."""
    return output


# --- DP_COMPUTE ---------------------------------------------------------------------------------------


def dispatch_dp_compute(worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Check that every argument already is a per-rank list of length ``world_size``; pass them on.

    Raises:
        DispatchError: an argument is not a list or tuple, or has the wrong length (names the argument).
    """
    n = worker_group.world_size
    named = [(f"positional argument {i}", arg) for i, arg in enumerate(args)]
    named += [(f"keyword argument {key!r}", value) for key, value in kwargs.items()]
    for label, value in named:
        if not isinstance(value, list | tuple):
            raise DispatchError(
                f"Dispatch.DP_COMPUTE: {label} is a {_describe(value)}, expected a list with one entry per rank "
                f"(length world_size={n}). Pass a list, or use ONE_TO_ALL / DP_COMPUTE_PROTO."
            )
        if len(value) != n:
            raise DispatchError(
                f"Dispatch.DP_COMPUTE: {label} has length {len(value)}, expected world_size={n} (one entry per rank)."
            )
    return tuple(list(arg) for arg in args), {key: list(value) for key, value in kwargs.items()}


def collect_dp_compute(worker_group: WorkerGroup, output: list) -> list:
    """Return the per-rank outputs as a list after checking there is one per rank."""
    n = worker_group.world_size
    if len(output) != n:
        raise DispatchError(f"Dispatch.DP_COMPUTE: got {len(output)} outputs, expected world_size={n}.")
    return list(output)


# --- DP_COMPUTE_PROTO / DP_COMPUTE_METRIC ------------------------------------------------------------


def dispatch_dp_compute_data_proto(worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """Split every ``DataProto`` argument into ``world_size`` equal chunks; broadcast everything else.

    A batch whose length is not a multiple of ``world_size`` is first padded with
    ``pad_dataproto_to_divisor`` (its leading rows are appended, cycling when the batch is shorter than
    the padding); the pad count is reported through :data:`PADDING_SIZE_KWARG` so the group can strip
    the padding rows from the concatenated result. Rank ``i`` receives chunk ``i``.

    Raises:
        DispatchError: no ``DataProto`` argument, or ``DataProto`` arguments of different lengths.
    """
    return split_data_protos(worker_group.world_size, args, kwargs)


def split_data_protos(n: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Split every ``DataProto`` argument into ``n`` equal chunks (padding first); broadcast everything else.

    Returns per-chunk lists (length ``n``) for every argument, plus :data:`PADDING_SIZE_KWARG` /
    :data:`PADDED_ROWS_KWARG` when padding rows were added (see :func:`dispatch_dp_compute_data_proto`).

    Raises:
        DispatchError: no ``DataProto`` argument, or ``DataProto`` arguments of different lengths.
    """
    from verl.protocol import DataProto, pad_dataproto_to_divisor

    named = [(f"positional argument {i}", arg) for i, arg in enumerate(args)]
    named += [(f"keyword argument {key!r}", value) for key, value in kwargs.items()]
    lengths = {label: len(value) for label, value in named if isinstance(value, DataProto)}
    if not lengths:
        kinds = ", ".join(f"{label}: {_describe(value)}" for label, value in named) or "no arguments"
        raise DispatchError(
            f"Dispatch.DP_COMPUTE_PROTO/DP_COMPUTE_METRIC needs at least one DataProto argument to split across "
            f"ranks, got {kinds}. Use ONE_TO_ALL to send the same arguments to every rank."
        )
    if len(set(lengths.values())) > 1:
        raise DispatchError(
            f"Dispatch.DP_COMPUTE_PROTO: all DataProto arguments must have the same number of rows to be split "
            f"together, got {lengths}."
        )
    rows = next(iter(lengths.values()))
    pad_size = -rows % n

    def split(value: Any) -> list:
        if not isinstance(value, DataProto):
            return [value] * n
        padded, _ = pad_dataproto_to_divisor(value, n)
        if len(padded) != rows + pad_size:
            raise DispatchError(
                f"pad_dataproto_to_divisor({rows} rows, {n}) returned {len(padded)} rows, expected {rows + pad_size}."
            )
        return padded.chunk(n)

    out_args = tuple(split(arg) for arg in args)
    out_kwargs = {key: split(value) for key, value in kwargs.items()}
    if pad_size:
        out_kwargs[PADDING_SIZE_KWARG] = pad_size
        out_kwargs[PADDED_ROWS_KWARG] = rows + pad_size
    return out_args, out_kwargs


def collect_dp_compute_data_proto(worker_group: WorkerGroup, output: list) -> Any:
    """Concatenate the per-rank ``DataProto`` outputs in rank order (``DataProto.concat``).

    Raises:
        DispatchError: a rank returned something other than a ``DataProto`` (use DP_COMPUTE_METRIC then).
    """
    from verl.protocol import DataProto

    output = collect_dp_compute(worker_group, output)
    for rank, item in enumerate(output):
        if not isinstance(item, DataProto):
            raise DispatchError(
                f"Dispatch.DP_COMPUTE_PROTO: rank {rank} returned a {_describe(item)}, expected a DataProto to "
                "concatenate. Register the method with Dispatch.DP_COMPUTE_METRIC to get the per-rank list."
            )
    return DataProto.concat(output)


def collect_dp_compute_metric(worker_group: WorkerGroup, output: list) -> list:
    """Return the per-rank outputs (e.g. metric dicts) as a list, one per rank, in rank order."""
    return collect_dp_compute(worker_group, output)


def strip_padding(result: Any, pad_size: int, padded_rows: int | None = None) -> Any:
    """Remove the ``pad_size`` trailing padding rows a dispatch added, from a collected ``DataProto``.

    Non-``DataProto`` results (e.g. DP_COMPUTE_METRIC lists) are returned unchanged.

    Raises:
        DispatchError: the workers changed the number of rows, so the padding rows cannot be located.
    """
    if not pad_size:
        return result
    from verl.protocol import DataProto, unpad_dataproto

    if not isinstance(result, DataProto):
        return result
    if padded_rows is not None and len(result) != padded_rows:
        raise DispatchError(
            f"cannot remove {pad_size} padding rows: the workers returned {len(result)} rows in total for "
            f"{padded_rows} padded input rows. A method that changes the number of rows needs a batch whose "
            "size is a multiple of the world size."
        )
    return unpad_dataproto(result, pad_size)
