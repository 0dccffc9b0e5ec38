"""``verl sft`` on the Megatron engine over 2 gloo ranks (issue #21): TP=2 and DP=2 give the one-process reference
engine's numbers (the oracle: core's engine on the whole batch, same keys, :mod:`verl.testing.sft`).

Real launches: ``verl sft engine=megatron trainer.n_gpus_per_node=2 ...`` starts torchrun itself.
"""

from __future__ import annotations

import pytest
import torch

import verl.testing.sft as SC

pytestmark = pytest.mark.multiprocess
METRIC_RTOL = 1e-4  # as test_megatron_equivalence.py
WEIGHT_ATOL = 2e-5
COMPARED = ("train/loss", "train/grad_norm", "train/lr", "train/global_tokens", "val/loss")
LAYOUTS = {
    "tp2": ("engine.tensor_model_parallel_size=2",),
    "dp2": ("engine.use_distributed_optimizer=true",),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return SC.make_assets(tmp_path_factory.mktemp("megatron_sft"))


@pytest.fixture(scope="module")
def reference(assets, tmp_path_factory):
    return SC.reference_run(*assets, tmp_path_factory.mktemp("reference"))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_megatron_sft_over_two_ranks_equals_the_reference_engine(assets, reference, tmp_path, layout):
    SC.launch(*assets, tmp_path, "engine=megatron", "trainer.n_gpus_per_node=2", *LAYOUTS[layout])
    want_rows, want_weights = reference
    rows = SC.metrics(tmp_path)
    assert [r["step"] for r in rows] == [r["step"] for r in want_rows] == list(range(1, SC.STEPS + 1))
    for got, want in zip(rows, want_rows, strict=True):
        for key in COMPARED:
            assert (key in got) == (key in want), (got["step"], key)
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=METRIC_RTOL, abs=1e-7), (layout, got["step"], key)
    weights = SC.hf_weights(tmp_path / "final_hf")
    if "lm_head.weight" in weights and "lm_head.weight" not in want_weights:
        # The tiny model ties its LM head to the embedding; Megatron's HF export writes the head out as well.
        assert torch.equal(weights.pop("lm_head.weight"), weights["model.embed_tokens.weight"])
    assert sorted(weights) == sorted(want_weights)
    for name, tensor in want_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=WEIGHT_ATOL, msg=f"{layout} {name}")
    # Megatron's own checkpoint format in actor/ (every rank its shard).
    assert any((tmp_path / "global_step_4" / "actor").iterdir())
