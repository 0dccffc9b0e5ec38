"""``data.dataloader_num_workers`` reads rows in worker processes and keeps resume exact (issue #15).

Oracle: the same loader with no workers (batches and sampler state), and the uninterrupted run for resume.
"""

from __future__ import annotations

import os

import pytest

from verl.config import load_config
from verl.data.sampler import PromptDataLoader, create_dataloader


class PidRows:
    """Row ``i`` is ``{"i": i, "pid": <process that read it>}``."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict:
        return {"i": int(i), "pid": os.getpid()}


def _ids(rows):
    return [r["i"] for r in rows]


def _loader(workers: int) -> PromptDataLoader:
    return PromptDataLoader(PidRows(), 4, shuffle=True, seed=7, collate_fn=lambda rows: rows, num_workers=workers)


def test_workers_read_the_rows_and_yield_the_same_batches_as_the_driver():
    plain, pooled = _loader(0), _loader(2)
    a = [_ids(b) for _ in range(2) for b in plain]  # two epochs
    got = [b for _ in range(2) for b in pooled]
    assert [_ids(b) for b in got] == a and len(a) == 2 * (23 // 4)
    assert {r["pid"] for b in got for r in b} - {os.getpid()}, "no row was read in a worker process"
    assert pooled.state_dict() == plain.state_dict()


def test_resume_after_a_break_is_exact_with_workers():
    reference = _loader(0)
    whole = [_ids(b) for _ in range(3) for b in reference]
    first = _loader(2)
    taken = []
    for batch in first:  # the workers prefetch ahead; only the two batches taken may count
        taken.append(_ids(batch))
        if len(taken) == 2:
            break
    state = first.state_dict()
    assert state == {"epoch": 0, "batch_in_epoch": 2, "seed": 7}
    resumed = _loader(2)
    resumed.load_state_dict(state)
    rest = [_ids(b) for b in resumed] + [_ids(b) for _ in range(2) for b in resumed]
    assert taken + rest == whole


def test_the_key_reaches_the_trainer_loaders():
    cfg = load_config(
        overrides=[
            "data.dataloader_num_workers=3",
            "data.train_batch_size=4",
            "data.val_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        ]
    )
    assert create_dataloader(PidRows(), cfg.data, train=True).num_workers == 3
    assert create_dataloader(PidRows(), cfg.data, train=False).num_workers == 3
    with pytest.raises(ValueError, match="dataloader_num_workers"):
        PromptDataLoader(PidRows(), 4, num_workers=-1)
