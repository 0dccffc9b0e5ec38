"""``mini_batch_schedule``: the optimizer steps of one ``train_batch`` call, shared by the reference and megatron
engines (verl's ppo_epochs x shuffle)."""

import pytest
import torch

from verl.engines.micro_batch import mini_batch_schedule
from verl.engines.reference.training import EngineSettings


def test_mini_batch_schedule_epochs_shuffle_and_refusals():
    plain = mini_batch_schedule(8, EngineSettings(mini_batch_size=4, ppo_epochs=2), global_step=0)
    assert [r.tolist() for r in plain] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    shuffled = EngineSettings(mini_batch_size=4, ppo_epochs=2, shuffle=True, data_loader_seed=7)
    steps = mini_batch_schedule(8, shuffled, global_step=3)
    for epoch in range(2):  # seed = data_loader_seed + 1_000_003 * global_step + epoch, one permutation per epoch
        want = torch.randperm(8, generator=torch.Generator().manual_seed(7 + 1_000_003 * 3 + epoch))
        assert torch.equal(torch.cat(steps[2 * epoch : 2 * epoch + 2]), want)
    assert mini_batch_schedule(3, EngineSettings(mini_batch_size=8), global_step=0)[0].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="not divisible into mini-batches of 4 rows"):
        mini_batch_schedule(6, EngineSettings(mini_batch_size=4), global_step=0)
    with pytest.raises(ValueError, match="on-policy log-prob reuse needs one optimizer step"):
        mini_batch_schedule(8, EngineSettings(mini_batch_size=4), global_step=0, old_log_prob_source="on_policy")
