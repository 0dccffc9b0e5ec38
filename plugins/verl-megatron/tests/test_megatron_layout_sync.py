"""The hybrid engine's resharding sync from megatron TP=2 (2 gloo ranks): into a TP=2 rollout each rank yields the
piece its own shard holds (no communication, no whole tensor: ``full_gathers == 0``); into a TP=1 rollout every
rank gets whole tensors (gathered). Values equal the HF model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl.testing.distributed import run_ranks
from verl.testing.tiny import save_tiny_model

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    model = save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")
    out = tmp_path_factory.mktemp("layout")
    run_ranks(HERE / "megatron_layout_scenario.py", [str(out), str(model)], world_size=2, timeout_s=240)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("rank", [0, 1])
def test_same_tp_layout_sends_each_rank_its_own_shard(results, rank):
    res = results[rank][2]
    assert not res["mismatched"], res["mismatched"][:3]
    assert res["worst"] <= 1e-6, res["worst"]
    assert res["names"] == results[rank]["hf_names"]
    assert res["manifest_ok"]
    assert res["stats"]["full_gathers"] == 0 and res["stats"]["tensors"] == len(res["names"])


@pytest.mark.parametrize("rank", [0, 1])
def test_tp1_layout_gets_whole_tensors(results, rank):
    res = results[rank][1]
    assert not res["mismatched"], res["mismatched"][:3]
    assert res["worst"] <= 1e-6, res["worst"]
    assert res["names"] == results[rank]["hf_names"]
    assert res["manifest_ok"]
