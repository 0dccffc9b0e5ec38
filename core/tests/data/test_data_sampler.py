"""StatefulSampler / PromptDataLoader: determinism, exact mid-epoch resume (K19), loader plumbing."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.data.dataset import collate_to_dicts
from verl.data.sampler import PromptDataLoader, StatefulSampler, create_dataloader


def take(sampler, steps: int) -> list[list[int]]:
    """Pull ``steps`` batches, looping over epochs the way a trainer does (one ``iter`` per epoch)."""
    out: list[list[int]] = []
    while len(out) < steps:
        for batch in sampler:
            out.append(batch)
            if len(out) == steps:
                break
    return out


def resume(sampler_args: dict, state: dict) -> StatefulSampler:
    fresh = StatefulSampler(**sampler_args)
    fresh.load_state_dict(json.loads(json.dumps(state)))  # state must survive a JSON round trip
    return fresh


def test_k19_resume_mid_epoch() -> None:
    args = {"num_samples": 8, "batch_size": 2, "shuffle": True, "seed": 1}
    run_a = take(StatefulSampler(**args), 8)

    b = StatefulSampler(**args)
    first = take(b, 6)
    state = b.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": 2, "seed": 1}
    rest = take(resume(args, state), 2)

    assert first == run_a[:6]
    assert rest == run_a[6:8]
    for epoch in range(2):
        seen = [i for batch in run_a[4 * epoch : 4 * epoch + 4] for i in batch]
        assert sorted(seen) == list(range(8)), f"epoch {epoch} is not a permutation: {seen}"
    assert run_a[:4] != run_a[4:], "epochs must be shuffled differently"


def test_order_is_a_function_of_seed_and_epoch() -> None:
    s = StatefulSampler(8, 2, seed=1)
    # The documented contract: numpy's PCG64 seeded with (seed, epoch).
    for epoch in range(3):
        assert s.order(epoch).tolist() == np.random.default_rng((1, epoch)).permutation(8).tolist()
    assert take(StatefulSampler(8, 2, seed=1), 4) == take(StatefulSampler(8, 2, seed=1), 4)
    assert take(StatefulSampler(8, 2, seed=1), 4) != take(StatefulSampler(8, 2, seed=2), 4)


def test_epoch_boundary_state_points_at_next_epoch() -> None:
    s = StatefulSampler(8, 2, seed=1)
    assert take(s, 4) and s.state_dict() == {"epoch": 1, "batch_in_epoch": 0, "seed": 1}
    assert list(s) == [s.order(1)[i : i + 2].tolist() for i in range(0, 8, 2)]


def test_sequential_and_last_batch() -> None:
    s = StatefulSampler(7, 2, shuffle=False, drop_last=False)
    assert len(s) == 4
    assert list(s) == [[0, 1], [2, 3], [4, 5], [6]]
    d = StatefulSampler(7, 2, shuffle=False, drop_last=True)
    assert len(d) == 3 and list(d) == [[0, 1], [2, 3], [4, 5]]


def test_bad_arguments_and_states() -> None:
    with pytest.raises(ValueError, match="fewer than batch_size=8"):
        StatefulSampler(3, 8)
    with pytest.raises(ValueError, match="batch_size"):
        StatefulSampler(3, 0)
    s = StatefulSampler(8, 2)
    with pytest.raises(ValueError, match="batch_in_epoch=4 does not fit 4 batches"):
        s.load_state_dict({"epoch": 0, "batch_in_epoch": 4, "seed": 1})
    with pytest.raises(KeyError, match="seed"):
        s.load_state_dict({"epoch": 0, "batch_in_epoch": 0})


def test_checkpoint_seed_wins(caplog: pytest.LogCaptureFixture) -> None:
    s = StatefulSampler(8, 2, seed=5)
    with caplog.at_level(logging.WARNING, logger="verl.data.sampler"):
        s.load_state_dict({"epoch": 0, "batch_in_epoch": 1, "seed": 1})
    assert "seed 1 instead of 5" in caplog.text
    assert take(s, 3) == take(StatefulSampler(8, 2, seed=1), 4)[1:]


@settings(max_examples=150, deadline=None)
@given(
    num_samples=st.integers(1, 20),
    batch_frac=st.floats(0.0, 1.0),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    stop_frac=st.floats(0.0, 1.0),
)
def test_resume_anywhere_equals_uninterrupted(num_samples, batch_frac, shuffle, drop_last, seed, stop_frac) -> None:
    batch_size = 1 + int(batch_frac * (num_samples - 1))
    args = {"num_samples": num_samples, "batch_size": batch_size, "shuffle": shuffle, "seed": seed}
    args["drop_last"] = drop_last
    per_epoch = len(StatefulSampler(**args))
    total = 3 * per_epoch
    stop = int(stop_frac * total)

    run_a = take(StatefulSampler(**args), total)
    b = StatefulSampler(**args)
    head = take(b, stop)
    tail = take(resume(args, b.state_dict()), total - stop)
    assert head + tail == run_a

    for e in range(3):
        seen = [i for batch in run_a[e * per_epoch : (e + 1) * per_epoch] for i in batch]
        assert len(seen) == len(set(seen)), "a sample repeated within an epoch"
        expected = per_epoch * batch_size if drop_last else num_samples
        assert len(seen) == expected and set(seen) <= set(range(num_samples))


def _items(n: int) -> list[dict]:
    import torch

    return [{"input_ids": torch.tensor([i, i]), "data_source": f"s{i}"} for i in range(n)]


def test_prompt_dataloader_batches_and_state() -> None:
    data = _items(6)
    loader = PromptDataLoader(data, 2, shuffle=False, collate_fn=collate_to_dicts)
    assert len(loader) == 3
    it = iter(loader)
    tensors, non_tensors = next(it)
    assert tensors["input_ids"].tolist() == [[0, 0], [1, 1]]
    assert list(non_tensors["data_source"]) == ["s0", "s1"]
    assert loader.state_dict() == {"epoch": 0, "batch_in_epoch": 1, "seed": 1}

    other = PromptDataLoader(data, 2, shuffle=False, collate_fn=collate_to_dicts)
    other.load_state_dict(loader.state_dict())
    assert [t["input_ids"][:, 0].tolist() for t, _ in other] == [[2, 3], [4, 5]]

    with pytest.raises(ValueError, match="sampler covers 5 samples but the dataset has 6"):
        PromptDataLoader(data, 2, StatefulSampler(5, 2))


def test_create_dataloader_follows_verl_config() -> None:
    data = _items(10)
    cfg = SimpleNamespace(train_batch_size=4, gen_batch_size=None, val_batch_size=None, shuffle=True, seed=None)
    train = create_dataloader(data, cfg, train=True)
    assert (len(train), train.batch_size, train.sampler.shuffle, train.sampler.seed) == (2, 4, True, 1)
    val = create_dataloader(data, cfg, train=False)
    assert (len(val), val.batch_size, val.sampler.shuffle, val.sampler.drop_last) == (1, 10, False, False)
    gen = create_dataloader(data, {"train_batch_size": 4, "gen_batch_size": 5, "seed": 7}, train=True)
    assert (len(gen), gen.sampler.seed) == (2, 7)
