"""Mesh-aware DataProto dispatch: split a batch over data-parallel replicas made of several ranks.

A tensor-parallel rollout of ``T`` ranks per replica wants each replica's ``T`` ranks to get the *same*
chunk and only one of them to return it. Workers declare their place once
(:meth:`Worker.register_dispatch_collect_info(mesh_name, dp_rank=, dp_size=, is_collect=)`); a method
registered with ``dispatch_mode=make_nd_compute_dataproto_dispatch_fn("rollout")`` then splits every
``DataProto`` into ``dp_size`` chunks (padding as ``DP_COMPUTE_PROTO`` does), hands chunk ``dp_rank`` to each
rank and concatenates the outputs of the collecting ranks in ``dp_rank`` order. Workers that registered
nothing are plain data parallel (rank ``i`` of ``W`` gets chunk ``i``). The group asks its workers once and
remembers the answer. Source: verl ``make_nd_compute_dataproto_dispatch_fn``
(verl/single_controller/base/decorator.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from verl.controller.dispatch import split_data_protos
from verl.controller.errors import DispatchError

if TYPE_CHECKING:  # pragma: no cover
    from verl.controller.worker_group import WorkerGroup

_CACHE_ATTR = "_verl_dispatch_info"


def dispatch_info(worker_group: WorkerGroup, mesh_name: str) -> list[tuple[int, int, bool]]:
    """``[(dp_rank, dp_size, is_collect)]`` per rank of ``worker_group`` for ``mesh_name`` (asked once, cached).

    Raises:
        DispatchError: only some workers registered the mesh, their ``dp_size`` differ, a chunk has no
            collecting rank or several, or a ``dp_rank`` is missing.
    """
    cache = worker_group.__dict__.setdefault(_CACHE_ATTR, {})
    if mesh_name in cache:
        return cache[mesh_name]
    answers = worker_group.execute_all("query_dispatch_info", mesh_name)
    n = worker_group.world_size
    if all(a is None for a in answers):
        info = [(rank, n, True) for rank in range(n)]
    elif any(a is None for a in answers):
        missing = [rank for rank, a in enumerate(answers) if a is None]
        raise DispatchError(f"mesh {mesh_name!r}: ranks {missing} registered no dispatch info while others did")
    else:
        info = [(int(d), int(s), bool(c)) for d, s, c in answers]
        sizes = {s for _, s, _ in info}
        if len(sizes) != 1:
            raise DispatchError(f"mesh {mesh_name!r}: workers disagree on dp_size ({sorted(sizes)})")
        (size,) = sizes
        collectors = sorted(d for d, _, c in info if c)
        if collectors != list(range(size)):
            raise DispatchError(
                f"mesh {mesh_name!r}: every dp_rank in [0, {size}) needs exactly one collecting rank, got {collectors}"
            )
    cache[mesh_name] = info
    return info


def dispatch_nd_compute_data_proto(mesh_name: str, worker_group: WorkerGroup, *args: Any, **kwargs: Any) -> tuple:
    """Split ``DataProto`` arguments into ``dp_size`` chunks; rank ``r`` gets chunk ``dp_rank(r)``."""
    info = dispatch_info(worker_group, mesh_name)
    size = info[0][1]
    chunked_args, chunked_kwargs = split_data_protos(size, args, kwargs)
    per_rank = [d for d, _, _ in info]

    def spread(value: Any) -> Any:
        return [value[d] for d in per_rank] if isinstance(value, list) and len(value) == size else value

    out_args = tuple(spread(a) for a in chunked_args)
    out_kwargs = {k: (v if k.startswith("_") else spread(v)) for k, v in chunked_kwargs.items()}
    return out_args, out_kwargs


def collect_nd_compute_data_proto(mesh_name: str, worker_group: WorkerGroup, output: list) -> Any:
    """Concatenate the collecting ranks' ``DataProto`` outputs in ``dp_rank`` order."""
    from verl.protocol import DataProto

    info = dispatch_info(worker_group, mesh_name)
    if len(output) != len(info):
        raise DispatchError(f"mesh {mesh_name!r}: got {len(output)} outputs for {len(info)} ranks")
    kept = sorted((d, rank) for rank, (d, _, c) in enumerate(info) if c)
    parts = []
    for _, rank in kept:
        item = output[rank]
        if not isinstance(item, DataProto):
            raise DispatchError(f"mesh {mesh_name!r}: rank {rank} returned a {type(item).__name__}, not a DataProto")
        parts.append(item)
    return DataProto.concat(parts)


@functools.cache
def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Any]:
    """A custom dispatch mode for ``@register(dispatch_mode=...)`` over mesh ``mesh_name`` (see the module doc)."""
    return {
        "dispatch_fn": functools.partial(dispatch_nd_compute_data_proto, mesh_name),
        "collect_fn": functools.partial(collect_nd_compute_data_proto, mesh_name),
    }
