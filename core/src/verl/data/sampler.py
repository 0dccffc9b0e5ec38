"""Seeded, resumable batch sampler and the prompt loader built on it.

verl keeps its train sampler state in ``global_step_N/data.pt`` (torchdata ``StatefulDataLoader``, anatomy
§3.8; here ``data.json``, no pickle). Here the whole state is three integers, ``{"epoch", "batch_in_epoch", "seed"}``: the
order of epoch ``e`` is a pure function of ``(seed, e)``, so a resumed run replays exactly the rest of
the interrupted epoch and then the same later epochs as an uninterrupted run (known-failures K19).

``data.dataloader_num_workers`` > 0 reads rows in that many ``torch.utils.data.DataLoader`` worker processes.
The loader is handed the epoch's remaining batches up front (the order is already fixed) and the position
advances only when a batch reaches the caller, so batches the workers prefetched but the trainer never took
are not counted: the state, and a resume from it, are the same as with no workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from verl.data.dataset import _cfg as _get
from verl.data.dataset import collate_fn as default_collate_fn

logger = logging.getLogger(__name__)


class StatefulSampler:
    """Yield batches of dataset indices; each ``iter()`` runs the rest of the current epoch.

    Args:
        num_samples: dataset length (> 0).
        batch_size: indices per batch (> 0).
        shuffle: permute each epoch with ``numpy.random.default_rng((seed, epoch))`` (PCG64, so the same on
            every platform); otherwise ``0..num_samples-1`` in order.
        seed: shuffling seed (verl's ``data.seed``, default 1 there too).
        drop_last: drop the final short batch (training); keep it (validation).

    Position advances as batches are handed out, so ``state_dict()`` taken after consuming batch ``k``
    resumes at batch ``k + 1``. Breaking out of a loop and iterating again continues the same epoch;
    after an epoch's last batch the position is the start of the next epoch.

    Raises:
        ValueError: non-positive sizes, or ``drop_last`` with fewer samples than one batch.
    """

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool = True, seed: int = 1, drop_last: bool = True):
        if num_samples <= 0:
            raise ValueError(f"num_samples must be > 0, got {num_samples}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if drop_last and num_samples < batch_size:
            raise ValueError(
                f"dataset has {num_samples} samples, fewer than batch_size={batch_size} with drop_last=True: "
                "no batch would ever be produced; lower the batch size or use more data"
            )
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self._position = 0  # batches handed out since epoch 0 started

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    @property
    def epoch(self) -> int:
        return self._position // len(self)

    @property
    def batch_in_epoch(self) -> int:
        return self._position % len(self)

    def order(self, epoch: int) -> np.ndarray:
        """The index order of ``epoch``, shape ``(num_samples,)`` int64."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_samples).astype(np.int64)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.remaining_batches():
            self._position += 1
            yield batch

    def remaining_batches(self) -> list[list[int]]:
        """The index batches left in the current epoch, without advancing (what ``iter()`` would yield)."""
        order = self.order(self.epoch)
        return [
            order[b * self.batch_size : (b + 1) * self.batch_size].tolist()
            for b in range(self.batch_in_epoch, len(self))
        ]

    def advance(self, batches: int = 1) -> None:
        """Count ``batches`` as handed out (the caller consumed them)."""
        self._position += int(batches)

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._position = epoch * len(self)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "batch_in_epoch", "seed"}``: plain ints (JSON/torch.save friendly)."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where :meth:`state_dict` was taken; the checkpoint's seed wins (warning if it differs).

        Raises ``KeyError`` for a missing key and ``ValueError`` when ``batch_in_epoch`` does not fit this
        sampler's batches per epoch (dataset or batch size changed since the checkpoint).
        """
        missing = [k for k in ("epoch", "batch_in_epoch", "seed") if k not in state]
        if missing:
            raise KeyError(f"sampler state lacks {missing}; got keys {sorted(state)}")
        epoch, batch, seed = int(state["epoch"]), int(state["batch_in_epoch"]), int(state["seed"])
        if epoch < 0 or not 0 <= batch < len(self):
            raise ValueError(
                f"sampler state epoch={epoch}, batch_in_epoch={batch} does not fit {len(self)} batches per epoch "
                f"({self.num_samples} samples, batch_size={self.batch_size}); was the dataset or batch size changed?"
            )
        if seed != self.seed:
            logger.warning("resuming sampler with the checkpoint's seed %d instead of %d", seed, self.seed)
        self.seed = seed
        self._position = epoch * len(self) + batch


class PromptDataLoader:
    """Iterate a dataset in batches chosen by a :class:`StatefulSampler`, collated to ``DataProto``.

    Args:
        dataset: anything with ``__len__`` and ``__getitem__(int) -> dict`` (e.g. ``RLHFDataset``).
        batch_size: prompts per batch; ignored when ``sampler`` is given.
        sampler: defaults to ``StatefulSampler(len(dataset), batch_size, shuffle, seed, drop_last)``.
        collate_fn: list of items -> batch; default :func:`verl.data.dataset.collate_fn` (``DataProto``).
        num_workers: ``data.dataloader_num_workers``: rows are read (``dataset[i]``) in that many
            ``torch.utils.data.DataLoader`` worker processes, collated here; 0 reads them in this process.
            The dataset must be picklable for workers (``RLHFDataset`` is).

    ``len()`` is batches per epoch; ``state_dict``/``load_state_dict`` are the sampler's, and count only the
    batches this loader yielded (never the ones workers prefetched), so resume is exact with workers too.

    Raises:
        ValueError: ``num_workers`` < 0.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        sampler: StatefulSampler | None = None,
        *,
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
        collate_fn: Callable[[Sequence[dict[str, Any]]], Any] = default_collate_fn,
        num_workers: int = 0,
    ):
        if int(num_workers) < 0:
            raise ValueError(
                f"data.dataloader_num_workers must be >= 0 (0 = read rows in the driver), got {num_workers}"
            )
        self.num_workers = int(num_workers)
        self.dataset = dataset
        if sampler is None:
            sampler = StatefulSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)
        elif sampler.num_samples != len(dataset):
            raise ValueError(f"sampler covers {sampler.num_samples} samples but the dataset has {len(dataset)}")
        self.sampler = sampler
        self.batch_size = sampler.batch_size
        self.collate_fn = collate_fn

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            for indices in self.sampler:
                yield self.collate_fn([self.dataset[i] for i in indices])
            return
        from torch.utils.data import DataLoader

        batches = self.sampler.remaining_batches()
        if not batches:
            return
        # Workers only read rows; collating here keeps DataProto construction (and its checks) in one process.
        loader = DataLoader(self.dataset, batch_sampler=batches, num_workers=self.num_workers, collate_fn=_rows)
        for rows in loader:
            self.sampler.advance()
            yield self.collate_fn(rows)

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def _rows(items: list[Any]) -> list[Any]:
    """The DataLoader's collate in the workers: hand the rows back as they are."""
    return items


def create_dataloader(dataset: Any, data_config: Any, *, train: bool = True) -> PromptDataLoader:
    """Build the train or validation loader the way verl's trainer does (``create_rl_sampler`` + loader).

    Train: ``batch_size = data.gen_batch_size or data.train_batch_size``, ``shuffle = data.shuffle`` (True),
    ``seed = data.seed`` (1 when null), ``drop_last=True``.
    Validation: ``batch_size = data.val_batch_size or len(dataset)``, ``shuffle = data.validation_shuffle``
    (False), ``drop_last=False``. Both read rows in ``data.dataloader_num_workers`` worker processes.
    """
    seed = int(_get(data_config, "seed", 1))
    workers = int(_get(data_config, "dataloader_num_workers", 0))
    if train:
        batch_size = _get(data_config, "gen_batch_size", None) or _get(data_config, "train_batch_size", 1024)
        return PromptDataLoader(
            dataset,
            int(batch_size),
            shuffle=bool(_get(data_config, "shuffle", True)),
            seed=seed,
            drop_last=True,
            num_workers=workers,
        )
    batch_size = _get(data_config, "val_batch_size", None) or len(dataset)
    return PromptDataLoader(
        dataset,
        int(batch_size),
        shuffle=bool(_get(data_config, "validation_shuffle", False)),
        seed=seed,
        drop_last=False,
        num_workers=workers,
    )
