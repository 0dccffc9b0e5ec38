"""Megatron checkpoints at TP=2 on 2 gloo ranks: dist_checkpointing resume, layout refusal, merge_to_hf, save_hf
(reading through :mod:`verl_megatron.safe_dist_ckpt`; the planted-file tests are in
``test_megatron_safe_checkpoint.py``).

The TP=2 launch (``megatron_scenarios._tp2_extras``) trains one step, saves ``ckpt_tp2`` and continues one step;
a fresh engine built from another model (other initial weights) loads the checkpoint and takes the same step.
The world-1 ``export`` run (``conftest.megatron_export``) loads that checkpoint into TP=1 engines and merges it.
"""

from __future__ import annotations

import json

import pytest
import torch

from verl.testing.conformance.training import assert_weights_close

RESUME_ATOL = 1e-7  # the same shards, optimizer state and LR schedule: the resumed step repeats the original's


def _hf_state(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()


def test_resume_from_dist_checkpoint_equals_continuing(megatron_launch):
    _, ranks = megatron_launch("tp2")
    for rank, res in enumerate(ranks):
        moved = max(float((res["fresh_weights"][k] - v).abs().max()) for k, v in res["ckpt_weights"].items())
        assert moved > 1e-2, f"rank {rank}: the fresh engine starts from the checkpoint's weights; nothing is proven"
        assert_weights_close(res["loaded_weights"], res["ckpt_weights"], atol=0.0, what=f"rank {rank}: loaded")
        # The optimizer exactly as saved: main params, AdamW moments and step counts of every inner optimizer.
        assert res["loaded_optimizer"].keys() == res["ckpt_optimizer"].keys()
        assert any(k.endswith(".exp_avg_sq") for k in res["ckpt_optimizer"]), sorted(res["ckpt_optimizer"])
        for key, want in res["ckpt_optimizer"].items():
            assert torch.equal(res["loaded_optimizer"][key], want), f"rank {rank}: {key}"
        assert res["loaded_nonfinite"] == ([], []), f"rank {rank}: a healthy checkpoint reported non-finite"
        assert res["loaded_step"] == 1
        # Equal next steps need AdamW's moments and step counts and the LR schedule (step 2 of the warm-up), not
        # just the weights: a lost schedule restarts at the warm-up's lr 0 and the weights would not move.
        assert_weights_close(
            res["resumed_weights"], res["continued_weights"], atol=RESUME_ATOL, what=f"rank {rank}: resumed step"
        )
        for key, want in res["continued_metrics"].items():
            assert res["resumed_metrics"][key] == pytest.approx(want, rel=1e-6, abs=1e-9), (rank, key)
        step_moved = max(float((res["continued_weights"][k] - v).abs().max()) for k, v in res["ckpt_weights"].items())
        assert step_moved > 1e-4, f"rank {rank}: the step after the checkpoint did not move the weights"


def test_checkpoint_folder_layout(megatron_launch):
    out, _ = megatron_launch("tp2")
    folder = out / "ckpt_tp2"
    assert (folder / "dist_ckpt").is_dir()
    info = json.loads((folder / "verl_megatron.json").read_text())
    assert info["global_step"] == 1
    assert info["layout"] == {"world": 2, "tp": 2, "pp": 1, "dp": 1}


def test_trainable_tp1_engine_refuses_the_tp2_checkpoint(megatron_export):
    """The optimizer state is stored per layout: a trainable TP=1 engine raises ValueError naming both layouts."""
    _, res = megatron_export
    message = res["refusal"]
    assert message is not None, "a trainable TP=1 engine loaded a TP=2 checkpoint without an error"
    assert "{'world': 2, 'tp': 2, 'pp': 1, 'dp': 1}" in message, message
    assert "{'world': 1, 'tp': 1, 'pp': 1, 'dp': 1}" in message, message


def test_forward_only_tp1_engine_reads_the_tp2_model_shards(megatron_export, megatron_launch):
    """dist_checkpointing reshards the model: a TP=1 ``ref`` engine loads the TP=2 checkpoint's weights."""
    _, res = megatron_export
    _, ranks = megatron_launch("tp2")
    assert_weights_close(res["tp1_ref_weights"], ranks[0]["ckpt_weights"], atol=0.0, what="TP=1 read of TP=2 shards")


def test_merge_to_hf_gives_the_weights_at_save_time(megatron_export, megatron_launch):
    out, res = megatron_export
    _, ranks = megatron_launch("tp2")
    merged = _hf_state(res["merged"])
    assert_weights_close(merged, ranks[0]["ckpt_weights"], atol=0.0, what="merge_to_hf of the TP=2 checkpoint")


def test_export_of_a_planted_checkpoint_runs_nothing(megatron_export):
    """``verl export`` (``merge_to_hf``) of a checkpoint whose DCP ``.metadata`` is a pickle that creates a file: the
    file is refused by name and the pickle never runs (megatron-core's own reader is a plain ``pickle.load``)."""
    _, res = megatron_export
    assert not res["planted_ran"], "the planted .metadata ran during verl export"
    error = res["planted_error"]
    assert error is not None and error.startswith("CheckpointFileError"), error
    assert "ckpt_tp2_planted/dist_ckpt/.metadata" in error and "io.open is not allowed" in error, error


def test_save_hf_on_two_ranks(megatron_launch):
    """``save_hf`` after the continued step: ``from_pretrained`` gives what ``iter_weights()`` gave then."""
    out, ranks = megatron_launch("tp2")
    assert_weights_close(_hf_state(out / "hf_tp2"), ranks[0]["continued_weights"], atol=0.0, what="save_hf at TP=2")
