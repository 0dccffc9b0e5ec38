"""Megatron on 2 gloo ranks (TP=2, PP=2, DP=2 with the distributed optimizer) vs core's reference engine.

The oracle is the ``reference`` engine in this process on the conformance kit's whole 8-row batch, built like the
kit's (``reference_config``, the plugin manager's spec). Rank results come from ``megatron_scenarios.run``, one
launch per layout (``conftest.megatron_launch``): at TP=2 and PP=2 (dp=1) both ranks get all 8 rows, at DP=2
rank ``r`` gets rows ``[4r, 4r + 4)`` with ``ppo_mini_batch_size=8`` global (4 rows per rank). Tolerances are
the kit's: log-probs / entropy 1e-5 absolute, metrics 1e-4 relative, weights after two updates 1e-5 absolute.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from verl.testing.conformance import (
    build_training_engine,
    check_log_probs_close,
    make_training_batch,
    plugin_spec,
    reference_config,
)
from verl.testing.conformance.training import assert_weights_close
from verl.workers.losses import make_ppo_loss

LOGPROB_ATOL = 1e-5
WEIGHT_ATOL = 1e-5
METRIC_RTOL = 1e-4
LAYOUTS = ["tp2", "pp2", "dp2"]


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in engine.iter_weights()}


@pytest.fixture(scope="module")
def reference_run(megatron_models, scenarios) -> dict[str, Any]:
    """The oracle: log-probs and entropy at the initial weights, then the kit's two PPO updates, whole batch."""
    model = megatron_models["model"]
    spec = plugin_spec("training_engine", "reference")
    engine = build_training_engine(
        spec, reference_config(model), model=model, total_training_steps=scenarios.TOTAL_TRAINING_STEPS
    )
    batch = make_training_batch()
    out = engine.compute_log_prob(batch, calculate_entropy=True).batch
    logp = {k: out[k].clone() for k in ("old_log_probs", "entropys")}
    initial = _weights(engine)
    loss_fn = make_ppo_loss(reference_config(model).actor_rollout_ref.actor)
    metrics = [engine.train_batch(batch, loss_fn) for _ in range(scenarios.STEPS)]
    return {"batch": batch, "logp": logp, "initial": initial, "metrics": metrics, "weights": _weights(engine)}


def _metric(metrics: dict, key: str) -> float:
    values = metrics[key] if isinstance(metrics[key], list | tuple) else [metrics[key]]
    assert len(values) == 1, f"{key} has {len(values)} values for one mini-batch: {values}"
    return float(values[0])


def _assert_metrics_match(got: list[dict], want: list[dict], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} updates, want {len(want)}"
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        for key in w:
            assert key in g, f"{what}: update {step} lacks metric {key!r} (the reference reports it); got {sorted(g)}"
            assert _metric(g, key) == pytest.approx(_metric(w, key), rel=METRIC_RTOL, abs=1e-7), (
                f"{what}: update {step}, {key}: megatron {g[key]}, reference {w[key]}"
            )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_log_probs_and_entropy_match_reference(megatron_launch, reference_run, scenarios, layout):
    """compute_log_prob(calculate_entropy=True) on every rank equals the reference's rows that rank received."""
    _, ranks = megatron_launch(layout)
    mask = reference_run["batch"].batch["response_mask"]
    for rank, res in enumerate(ranks):
        rows = scenarios.rows_of(layout, rank)
        for key in ("old_log_probs", "entropys"):
            got = res["logp"][key]
            assert got.dtype == torch.float32 and got.shape == mask[rows].shape, (key, got.dtype, got.shape)
            check_log_probs_close(
                got, reference_run["logp"][key][rows], mask[rows], atol=LOGPROB_ATOL, what=f"{layout} rank {rank} {key}"
            )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ref_role_log_probs_equal_actor_at_step_0(megatron_launch, layout):
    """The forward-only ``ref`` engine (no DDP, no optimizer) computes the actor's step-0 log-probs and entropy."""
    _, ranks = megatron_launch(layout)
    for rank, res in enumerate(ranks):
        for key in ("old_log_probs", "entropys"):
            diff = float((res["ref_logp"][key] - res["logp"][key]).abs().max())
            assert diff <= LOGPROB_ATOL, f"{layout} rank {rank}: ref {key} differ from the actor's by {diff:.3g}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_updates_match_reference(megatron_launch, reference_run, layout):
    """The kit's two PPO updates (the first at the warm-up's lr 0): every reference metric, and the full HF weights
    from ``iter_weights()`` on every rank equal the reference's after them."""
    _, ranks = megatron_launch(layout)
    moved = max(float((reference_run["weights"][k] - v).abs().max()) for k, v in reference_run["initial"].items())
    assert moved > 10 * WEIGHT_ATOL, f"the reference's update moved the weights by only {moved:.3g}"
    for rank, res in enumerate(ranks):
        _assert_metrics_match(res["metrics"], reference_run["metrics"], f"{layout} rank {rank}")
        assert_weights_close(
            res["weights"], reference_run["weights"], atol=WEIGHT_ATOL, what=f"{layout} rank {rank} after two updates"
        )
        assert list(res["weights"]) == list(reference_run["weights"]), "iter_weights() is not in HF state-dict order"
    assert_weights_close(ranks[1]["weights"], ranks[0]["weights"], atol=0.0, what=f"{layout}: rank 1 vs rank 0")


EXPECTED_DISPATCH = {
    # (dp_rank, dp_size, is_collect) per rank: one replica at TP=2 (collected from TP rank 0) and at PP=2 (from the
    # last stage), two replicas at DP=2.
    "tp2": [(0, 1, True), (0, 1, False)],
    "pp2": [(0, 1, False), (0, 1, True)],
    "dp2": [(0, 2, True), (1, 2, True)],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dispatch_info_of_the_layout(megatron_launch, layout):
    _, ranks = megatron_launch(layout)
    assert [tuple(r["dispatch"]) for r in ranks] == EXPECTED_DISPATCH[layout]


def test_gradient_accumulation_micro_batch_1_equals_8_at_tp2(megatron_launch, reference_run):
    """TP=2: micro-batches of 1 row and one micro-batch of all 8 give the same two updates (and the reference's)."""
    _, ranks = megatron_launch("tp2")
    for rank, res in enumerate(ranks):
        for step, (m1, m8) in enumerate(zip(res["micro1_metrics"], res["micro8_metrics"], strict=True), start=1):
            for key in ("actor/grad_norm", "actor/pg_loss"):
                assert _metric(m1, key) == pytest.approx(_metric(m8, key), rel=METRIC_RTOL, abs=1e-7), (
                    f"rank {rank} update {step} {key}: micro 1 {m1[key]}, micro 8 {m8[key]}"
                )
        assert_weights_close(res["micro1_weights"], res["micro8_weights"], atol=WEIGHT_ATOL, what="micro 1 vs 8")
        assert_weights_close(res["micro8_weights"], reference_run["weights"], atol=WEIGHT_ATOL, what="micro 8 vs ref")


def test_state_dict_round_trip_per_rank_at_tp2(megatron_launch):
    """Save after step 1, step 2, load: log-probs are those at the save and step 2 repeats exactly (each rank)."""
    _, ranks = megatron_launch("tp2")
    for rank, res in enumerate(ranks):
        assert res["sd_restored_step"] == 1
        for key, value in res["sd_saved_logp"].items():
            assert torch.equal(res["sd_restored_logp"][key], value), f"rank {rank}: {key} after load_state_dict"
        assert res["sd_again_metrics"] == res["sd_second_metrics"], f"rank {rank}"
        assert_weights_close(
            res["sd_again_weights"], res["sd_second_weights"], atol=0.0, what=f"rank {rank}: step after load"
        )
