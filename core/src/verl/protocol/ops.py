"""Row-reshaping operations of DataProto: chunk, split, concat, reorder, repeat, padding, iteration.

Follows the methods of the same names in verl/protocol.py. Every operation is vectorised: splitting
uses ``TensorDict.split`` / ``np.split`` (views, no copies), joining uses one ``torch.cat`` /
``np.concatenate`` per key, and every reordering (repeat, sample_level_repeat, padding, reorder,
shuffling) builds one int64 row index and gathers all fields with it, so no field can drift out of
alignment with the others (known failure K13).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.protocol.errors import DataProtoConflictError, DataProtoError, DataProtoSizeError, DataProtoTypeError
from verl.protocol.indexing import RowIndex, normalize_row_index
from verl.protocol.unions import merge_meta_info

if TYPE_CHECKING:  # pragma: no cover
    from verl.protocol.core import DataProto

__all__ = ["DataProtoOpsMixin", "check_int", "chunk_sizes"]

# DataLoader options that make sense for make_iterator; others (num_workers, sampler, ...) are rejected.
_ITERATOR_OPTIONS = frozenset({"shuffle", "drop_last"})


def check_int(value: Any, name: str, minimum: int) -> int:
    """Return ``value`` as int if it is an integer (not bool) ``>= minimum``.

    Raises:
        DataProtoTypeError: not an integer. DataProtoError: below ``minimum``.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise DataProtoTypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise DataProtoError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def chunk_sizes(length: int, chunks: int) -> list[int]:
    """Row counts of the ``chunks`` pieces :meth:`DataProto.chunk` makes of ``length`` rows.

    verl's rule (``torch.chunk``): pieces of ``ceil(length / chunks)`` rows until the rows run out, the
    rest empty. ``chunk_sizes(10, 4) == [3, 3, 3, 1]``, ``chunk_sizes(5, 4) == [2, 2, 1, 0]``,
    ``chunk_sizes(8, 4) == [2, 2, 2, 2]``.
    """
    size = -(-length // chunks)
    return [max(0, min(size, length - i * size)) for i in range(chunks)]


class DataProtoOpsMixin:
    """Row-reshaping methods mixed into :class:`verl.protocol.DataProto`."""

    batch: Any
    non_tensor_batch: dict
    meta_info: dict

    # ---------------------------------------------------------------------------------------- splitting
    def _split_by_sizes(self, sizes: Sequence[int]) -> list[DataProto]:
        sizes = [int(size) for size in sizes]
        boundaries = np.cumsum(sizes)[:-1].tolist()
        if self.batch is None:
            batches = [None] * len(sizes)
        elif sizes and sizes[0] > 0 and all(size == sizes[0] for size in sizes):
            batches = list(self.batch.chunk(len(sizes), dim=0))  # equal pieces: TensorDict.chunk is the cheapest
        else:
            batches = list(self.batch.split(sizes, dim=0))
        arrays = {key: np.split(value, boundaries) for key, value in self.non_tensor_batch.items()}
        # Views of a checked DataProto: no second consistency check per piece.
        return [
            type(self)._derived(batches[i], {key: parts[i] for key, parts in arrays.items()}, dict(self.meta_info))
            for i in range(len(sizes))
        ]

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split rows into exactly ``chunks`` consecutive pieces (views); meta_info copied to each.

        Follows verl/protocol.py ``chunk``: ``len(self)`` must be divisible by ``chunks`` unless auto
        padding is enabled (:meth:`is_padding_enabled`). An uneven split uses verl's rule (that of
        ``TensorDict.chunk`` / ``torch.chunk``): every piece holds ``ceil(len / chunks)`` rows until the
        rows run out, so only the last non-empty piece is short: 10 rows into 4 give ``[3, 3, 3, 1]``.
        Where that rule fills fewer than ``chunks`` pieces (5 rows into 4: ``[2, 2, 1]``), verl fails;
        here the remaining pieces are empty (``[2, 2, 1, 0]``), so there are always ``chunks`` pieces. For
        dispatch, pad first with ``pad_dataproto_to_divisor(data, chunks)`` (what verl's dispatch does).

        Raises:
            DataProtoSizeError (an AssertionError, as verl asserts): uneven length without auto padding
                (names both sizes).
            DataProtoError: ``chunks < 1``.
        """
        chunks = check_int(chunks, "chunks", 1)
        length = len(self)
        remainder = length % chunks
        if remainder and not self.is_padding_enabled():
            raise DataProtoSizeError(
                f"cannot chunk a DataProto of {length} rows into {chunks} equal chunks ({length} % {chunks} = "
                f"{remainder}); pad first with pad_dataproto_to_divisor(data, {chunks}), use split(size) for "
                "uneven pieces, or enable auto padding"
            )
        return self._split_by_sizes(chunk_sizes(length, chunks))

    def split(self, split_size: int) -> list[DataProto]:
        """Split rows into pieces of ``split_size`` (views); the last piece holds the remainder.

        Gives ``ceil(len / split_size)`` pieces in order (124 rows, size 8 -> 15 x 8 + 1 x 4; K12) and
        ``[]`` for an empty DataProto. Follows verl/protocol.py ``split``.

        Raises:
            DataProtoError: ``split_size < 1``.
        """
        split_size = check_int(split_size, "split_size", 1)
        full, remainder = divmod(len(self), split_size)
        sizes = [split_size] * full + ([remainder] if remainder else [])
        return self._split_by_sizes(sizes) if sizes else []

    # ------------------------------------------------------------------------------------------ joining
    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate DataProtos along rows; returns an instance of ``type(data[0])``.

        Follows verl/protocol.py ``concat``: tensors via ``torch.cat`` and arrays via ``np.concatenate``,
        one call per key. meta_info is merged by :func:`verl.protocol.unions.merge_meta_info`:
        ``meta_info["metrics"]`` of all parts is gathered into one ``dict[str, list]`` (list values
        extended, other values appended), every other key must agree across parts.

        Raises:
            DataProtoConflictError (ValueError, AssertionError as verl's assert): parts disagree on having a
                batch or on their key sets (the key and part index are named), or meta_info conflicts.
            DataProtoError: empty input; parts disagree on a tensor's dtype or on trailing shapes.
            DataProtoTypeError: an element is not a DataProto.
        """
        parts = list(data)
        if not parts:
            raise DataProtoError("concat needs at least one DataProto, got an empty list")
        for index, part in enumerate(parts):
            if not isinstance(part, DataProtoOpsMixin):
                raise DataProtoTypeError(f"concat: element {index} is a {type(part).__name__}, not a DataProto")
        first = parts[0]
        batch = None
        if first.batch is not None:
            keys = set(first.batch.keys(include_nested=True, leaves_only=True))
            for index, part in enumerate(parts[1:], start=1):
                if part.batch is None:
                    raise DataProtoConflictError(f"concat: part 0 has a batch but part {index} has none")
                _check_same_keys(keys, set(part.batch.keys(include_nested=True, leaves_only=True)), index, "batch")
            for key in keys:
                dtypes = {part.batch.get(key).dtype for part in parts}
                if len(dtypes) > 1:
                    raise DataProtoError(
                        f"concat: batch[{key!r}] has different dtypes across parts: {sorted(map(str, dtypes))}"
                    )
            try:
                batch = torch.cat([part.batch for part in parts], dim=0)
            except RuntimeError as error:
                raise DataProtoError(f"concat: tensors of the parts do not fit together: {error}") from error
        else:
            for index, part in enumerate(parts[1:], start=1):
                if part.batch is not None:
                    raise DataProtoConflictError(f"concat: part {index} has a batch but part 0 has none")
        keys = set(first.non_tensor_batch)
        for index, part in enumerate(parts[1:], start=1):
            _check_same_keys(keys, set(part.non_tensor_batch), index, "non_tensor_batch")
        arrays = {}
        for key in first.non_tensor_batch:
            try:
                arrays[key] = np.concatenate([part.non_tensor_batch[key] for part in parts], axis=0)
            except ValueError as error:
                raise DataProtoError(
                    f"concat: non_tensor_batch[{key!r}] shapes do not fit together: {error}"
                ) from error
        meta = merge_meta_info((part.meta_info for part in parts), where="concat")
        return type(first)(batch=batch, non_tensor_batch=arrays, meta_info=meta)

    # ----------------------------------------------------------------------------------------- gathering
    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Reorder rows in place: row ``i`` becomes old row ``indices[i]`` (follows verl/protocol.py).

        ``indices``: 1-D integer tensor/array/list (verl requires a tensor). Usually a permutation; any
        in-range positions are accepted, which changes the length like verl does.

        Raises:
            DataProtoIndexError / DataProtoTypeError / DataProtoError: see ``normalize_row_index``.
        """
        taken = self._take(normalize_row_index(indices, len(self), "reorder indices"))
        self.batch, self.non_tensor_batch = taken.batch, taken.non_tensor_batch

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times; every tensor and non-tensor field moves together.

        ``interleave=True``: ``[a, b] -> [a, a, b, b]`` (``repeat_interleave``, used for rollout.n);
        ``interleave=False``: ``[a, b] -> [a, b, a, b]`` (tile). Length ``len * repeat_times``; copies;
        meta_info copied. Follows verl/protocol.py ``repeat``.

        Raises:
            DataProtoError / DataProtoTypeError: ``repeat_times`` is not an int ``>= 1``.
        """
        repeat_times = check_int(repeat_times, "repeat_times", 1)
        length = len(self)
        rows = np.arange(length, dtype=np.int64)
        rows = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        batch = None
        if self.batch is not None:
            # One contiguous copy per tensor; repeat_interleave is about 20% faster than a gather by row index.
            if interleave:
                batch = self.batch.apply(lambda t: t.repeat_interleave(repeat_times, dim=0), batch_size=[len(rows)])
            else:
                batch = self.batch.apply(lambda t: t.repeat(repeat_times, *[1] * (t.dim() - 1)), batch_size=[len(rows)])
        # Tensors and arrays follow the same row order (K13): ``rows`` is the order the tensor ops produce.
        arrays = {key: value[rows] for key, value in self.non_tensor_batch.items()}
        return type(self)._derived(batch, arrays, dict(self.meta_info))

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row ``i`` ``repeat_times[i]`` times, in order (follows verl/protocol.py).

        ``repeat_times``: list/tuple/1-D tensor/1-D ndarray of non-negative ints, one per row; result
        length ``sum(repeat_times)``.

        Raises:
            DataProtoTypeError: unsupported type or non-integer dtype.
            DataProtoError: not 1-D, wrong length, or a negative count.
        """
        if isinstance(repeat_times, torch.Tensor):
            counts = repeat_times.detach().cpu().numpy()
        elif isinstance(repeat_times, np.ndarray | list | tuple):
            counts = np.asarray(repeat_times) if len(repeat_times) else np.zeros(0, dtype=np.int64)
        else:
            raise DataProtoTypeError(
                f"repeat_times must be a list, tuple, np.ndarray or torch.Tensor, got {type(repeat_times).__name__}"
            )
        if counts.ndim != 1 or counts.dtype.kind not in "iu":
            raise DataProtoError(f"repeat_times must be 1-D integers, got shape {counts.shape} dtype {counts.dtype}")
        if counts.shape[0] != len(self):
            raise DataProtoError(f"repeat_times has {counts.shape[0]} entries but the DataProto has {len(self)} rows")
        if counts.size and counts.min() < 0:
            raise DataProtoError(f"repeat_times must be >= 0, got {int(counts.min())}")
        return self._take(RowIndex(np.repeat(np.arange(len(self), dtype=np.int64), counts)))

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the last row (``"first"``: the first row), in place.

        Follows verl/protocol.py ``padding`` (``""`` and ``"last"`` both mean the last row; meta_info
        unchanged). ``padding_size == 0`` is a no-op.

        Raises:
            DataProtoError: negative size, unknown candidate, or padding an empty DataProto.
        """
        padding_size = check_int(padding_size, "padding_size", 0)
        if padding_candidate not in ("", "first", "last"):
            raise DataProtoError(f"padding_candidate must be 'first', 'last' or '', got {padding_candidate!r}")
        if padding_size == 0:
            return
        length = len(self)
        if length == 0:
            raise DataProtoError(f"cannot pad an empty DataProto by {padding_size} rows: there is no row to copy")
        source = 0 if padding_candidate == "first" else length - 1
        rows = np.concatenate([np.arange(length, dtype=np.int64), np.full(padding_size, source, dtype=np.int64)])
        padded = self._take(RowIndex(rows))
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    # ----------------------------------------------------------------------------------------- iteration
    def make_iterator(
        self, mini_batch_size: int, epochs: int, seed: int | None = None, dataloader_kwargs: dict | None = None
    ) -> Iterator[DataProto]:
        """Iterate mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs (follows verl/protocol.py).

        Yields ``epochs * len / mini_batch_size`` DataProtos, each with ``self.meta_info`` (copied).
        As in verl, rows are shuffled only when ``dataloader_kwargs={"shuffle": True}``; each epoch then
        uses a fresh ``torch.randperm(len, generator=g)`` from one generator ``g`` seeded with ``seed``
        (the same order torch's ``DataLoader``/``RandomSampler`` gives verl; unseeded -> torch's global RNG).
        Without shuffling the mini-batches are views in row order. Batches are sliced directly instead of
        collated row by row, so non-tensor dtypes are preserved (verl's collate turns them into object).

        Args:
            dataloader_kwargs: only ``shuffle`` and ``drop_last`` are understood (divisibility makes
                ``drop_last`` moot).

        Raises:
            DataProtoSizeError (an AssertionError, as in verl): ``len`` not divisible by ``mini_batch_size``
                (both named). DataProtoError: bad ints.
            DataProtoTypeError: unsupported ``dataloader_kwargs`` keys.
        """
        mini_batch_size = check_int(mini_batch_size, "mini_batch_size", 1)
        epochs = check_int(epochs, "epochs", 0)
        options = dict(dataloader_kwargs or {})
        unknown = sorted(set(options) - _ITERATOR_OPTIONS)
        if unknown:
            raise DataProtoTypeError(
                f"make_iterator: unsupported dataloader_kwargs {unknown}; supported: {sorted(_ITERATOR_OPTIONS)}"
            )
        length = len(self)
        if length % mini_batch_size:
            raise DataProtoSizeError(
                f"make_iterator: {length} rows are not divisible by mini_batch_size={mini_batch_size} "
                f"({length} % {mini_batch_size} = {length % mini_batch_size}); pad or pick a divisor"
            )
        shuffle = bool(options.get("shuffle", False))
        generator = None
        if shuffle and seed is not None:
            generator = torch.Generator()
            generator.manual_seed(int(seed))
        return self._iterate(mini_batch_size, epochs, shuffle, generator)

    def _iterate(
        self, mini_batch_size: int, epochs: int, shuffle: bool, generator: torch.Generator | None
    ) -> Iterator[DataProto]:
        length = len(self)
        for _ in range(epochs):
            if shuffle:
                order = self._take(RowIndex(_epoch_permutation(length, generator).numpy()))
            else:
                order = self
            for piece in order.split(mini_batch_size):
                piece.meta_info = dict(self.meta_info)
                yield piece


def _epoch_permutation(length: int, generator: torch.Generator | None) -> torch.Tensor:
    # Consume the RNG exactly like one epoch of DataLoader(shuffle=True, generator=g) in torch 2.x, so a
    # seed gives verl's row order: the loader draws a base seed, RandomSampler draws the permutation, and
    # (num_samples % n == 0) one more, discarded, permutation before it stops.
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    if generator is None:
        sampler_generator = torch.Generator()
        sampler_generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        return torch.randperm(length, generator=sampler_generator)
    permutation = torch.randperm(length, generator=generator)
    torch.randperm(length, generator=generator)
    return permutation


def _check_same_keys(expected: set, actual: set, index: int, where: str) -> None:
    if expected == actual:
        return
    missing, extra = sorted(map(str, expected - actual)), sorted(map(str, actual - expected))
    raise DataProtoConflictError(
        f"concat: part {index} has different {where} keys than part 0 (missing {missing}, extra {extra}); "
        "every part must carry the same keys"
    )
