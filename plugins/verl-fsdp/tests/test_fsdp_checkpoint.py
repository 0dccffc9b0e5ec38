"""Weights out of the FSDP engine: iter_weights, DCP and sharded-state resume, save_hf, merge_dcp_to_hf."""

from __future__ import annotations

import pytest
import torch

from verl.testing.tiny import make_tiny_model


def _max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_iter_weights_yields_full_hf_named_tensors(two_rank_results, scenarios):
    """Names and order are the HF state dict's; tensors are full (unsharded) on every rank."""
    _, ranks = two_rank_results
    hf = make_tiny_model(seed=scenarios.MODEL_SEED).state_dict()
    for r in ranks:
        weights = r["micro2_weights"]
        assert list(weights) == list(hf)
        assert all(weights[k].shape == hf[k].shape for k in hf)
    assert _max_abs(ranks[0]["micro2_weights"], ranks[1]["micro2_weights"]) == 0.0


@pytest.mark.parametrize("how", ["dcp", "state_dict"])
def test_resume_restores_weights_optimizer_and_counters(two_rank_results, how):
    """A fresh engine (other initial weights) loads the checkpoint; its next step equals the original's."""
    _, ranks = two_rank_results
    for r in ranks:
        assert r[f"{how}_global_step"] == 1
        assert _max_abs(r[f"{how}_loaded_weights"], r["ckpt_weights"]) == 0.0
        # Equal next steps need the AdamW moments and the LR schedule, not just the weights.
        assert _max_abs(r[f"{how}_resumed_weights"], r["after_weights"]) == 0.0
        assert r[f"{how}_resumed_metrics"] == r["after_metrics"]


def test_dcp_layout(two_rank_results):
    out, _ = two_rank_results
    names = {p.name for p in (out / "dcp").iterdir()}
    assert {".metadata", "verl_fsdp.json", "hf_config"} <= names
    assert {f"extra_state_world_size_2_rank_{r}.pt" for r in range(2)} <= names


def test_merge_dcp_to_hf_loads_with_from_pretrained(two_rank_results, tmp_path):
    from transformers import AutoModelForCausalLM
    from verl_fsdp import merge_dcp_to_hf

    out, ranks = two_rank_results
    merged = merge_dcp_to_hf(out / "dcp", None, tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(str(merged))
    assert _max_abs(model.state_dict(), ranks[0]["ckpt_weights"]) == 0.0
    assert model.config.use_cache is True
    # An explicit config source works too (the model folder the run started from).
    again = merge_dcp_to_hf(out / "dcp", out / "tiny_model", tmp_path / "merged2")
    assert _max_abs(AutoModelForCausalLM.from_pretrained(str(again)).state_dict(), ranks[0]["ckpt_weights"]) == 0.0


def test_merge_dcp_to_hf_rejects_a_non_checkpoint(tmp_path):
    from verl_fsdp import merge_dcp_to_hf

    with pytest.raises(FileNotFoundError, match=r"\.metadata"):
        merge_dcp_to_hf(tmp_path, None, tmp_path / "out")


def test_save_hf_writes_gathered_weights(two_rank_results):
    from transformers import AutoModelForCausalLM

    out, ranks = two_rank_results
    model = AutoModelForCausalLM.from_pretrained(str(out / "hf"))
    assert _max_abs(model.state_dict(), ranks[0]["after_weights"]) == 0.0
