"""The hybrid engine's weight sync on 2 gloo ranks: FSDP2 (DP=2) shards resharded into an hf rollout of
tensor-parallel size 2 (one replica split over both ranks) and 1 (a replica per rank).

Oracle: a one-process ``hf`` engine loaded with the FSDP engine's full weights generates the same tokens
(greedy and with per-row seeds) with the same log-probs. Memory: a dispatch-level allocation tracker on each
rank (not the resharder's own accounting) shows no whole split weight and a peak far below the model.
"""

from __future__ import annotations

import pytest
import torch

from verl.engines.reference.rollout import HFRolloutEngine
from verl.engines.weight_sync.layout import TensorParallelLayout
from verl.testing.tiny import make_tiny_model, make_tiny_tokenizer

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def oracle(two_rank_results, scenarios):
    out, ranks = two_rank_results
    engine = HFRolloutEngine(out / "tiny_model", make_tiny_tokenizer(), scenarios.rollout_config(1), device="cpu")
    engine.update_weights(iter(ranks[0]["sync_weights"].items()))
    return scenarios.rollout_outputs(engine)


@pytest.mark.parametrize("tp", [2, 1])
def test_synced_rollout_generates_what_the_full_weights_generate(two_rank_results, oracle, tp):
    _, ranks = two_rank_results
    for rank, res in enumerate(ranks):
        got = res[f"sync_tp{tp}"]["outputs"]
        for mode in ("greedy", "sampled"):
            assert torch.equal(got[mode]["responses"], oracle[mode]["responses"]), (rank, tp, mode)
            assert torch.allclose(
                got[mode]["rollout_log_probs"], oracle[mode]["rollout_log_probs"], atol=2e-5, rtol=0
            ), (rank, tp, mode)


def test_tp2_sync_moves_only_slices_and_never_builds_a_split_weight(two_rank_results, scenarios):
    _, ranks = two_rank_results
    model = make_tiny_model(seed=scenarios.MODEL_SEED)
    full = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    layout = TensorParallelLayout.for_model(model.config, world_size=2, tp_size=2)
    local = {
        shape if (p := layout.slice_for(n, shape, r)) is None else p.shape_of(shape)
        for n, shape in full.items()
        for r in range(2)
    }
    # Whole split weights, except shapes that are also some weight's slice (gate's half is q's whole shape).
    whole = {shape for n, shape in full.items() if layout.style_of(n)[1] is not None} - local
    assert (104, 32) in whole and (64, 32) in whole
    slice_bytes = max(torch.Size(shape).numel() * 4 for shape in local)
    for rank, res in enumerate(ranks):
        sync = res["sync_tp2"]
        assert not whole & {shape for shape, _ in sync["shapes"]}, rank
        assert sync["peak"] <= scenarios.SYNC_BUCKET + slice_bytes < model_bytes / 2, (rank, sync["peak"])
        m = sync["metrics"]
        assert m["skipped_tied"] == 1  # lm_head.weight is embed_tokens.weight: sent once
        assert m["full_gathers"] == 0 and m["buckets"] >= 1
        assert m["bytes"] < model_bytes / 2 + 4 * 32 * 8  # this rank's slices (+ replicated norms)
        assert sync["local_shapes"]["model.embed_tokens.weight"] == (52, 32)
        assert sync["local_shapes"]["model.layers.0.self_attn.o_proj.weight"] == (32, 16)


def test_tp1_sync_gives_every_rank_the_whole_model(two_rank_results, scenarios):
    _, ranks = two_rank_results
    model = make_tiny_model(seed=scenarios.MODEL_SEED)
    embed = model.model.embed_tokens.weight
    unique = sum(t.numel() * t.element_size() for n, t in model.state_dict().items() if n != "lm_head.weight")
    for res in ranks:
        m = res["sync_tp1"]["metrics"]
        assert m["bytes"] == unique and m["received_bytes"] > 0 and m["buckets"] >= 2
        assert res["sync_tp1"]["local_shapes"]["model.embed_tokens.weight"] == tuple(embed.shape)
