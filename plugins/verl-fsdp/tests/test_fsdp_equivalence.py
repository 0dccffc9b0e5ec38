"""FSDP (2 gloo ranks, half the batch each) vs ReferenceTrainingEngine (one process, whole batch).

The oracle is the reference engine, run here on the full global batch from the same seed; rank
results come from the session fixture ``two_rank_results`` (``fsdp_scenarios.run``).
"""

from __future__ import annotations

import pytest
import torch

from verl.engines.reference.training import ReferenceTrainingEngine
from verl.plugins import get_plugin_manager
from verl.testing.conformance import build_training_engine
from verl.workers.losses import make_ppo_loss

ATOL = 1e-5
RTOL = 1e-5


def _reference(scenarios, **kw) -> ReferenceTrainingEngine:
    return ReferenceTrainingEngine(
        scenarios.make_tiny_model(seed=scenarios.MODEL_SEED),
        scenarios.settings(mini_batch_size=scenarios.ROWS, **kw),
        optim=scenarios.optim(),
        total_training_steps=10,
    )


@pytest.fixture(scope="module")
def reference_run(scenarios):
    """The oracle: log-probs at the initial weights, then 3 token-mean steps on the whole batch."""
    engine = _reference(scenarios, micro_batch_size=4)
    full = scenarios.make_batch()
    logp = engine.compute_log_prob(full, calculate_entropy=True).batch
    metrics = scenarios.train(engine, full, scenarios.token_mean_loss)
    return {"logp": logp, "metrics": metrics, "weights": scenarios.weights(engine), "batch": full}


def _max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert list(a) == list(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_metrics_match(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        for key in w:
            assert g[key] == pytest.approx(w[key], rel=RTOL, abs=1e-7), key


def test_log_probs_and_entropy_match_reference(two_rank_results, reference_run):
    _, ranks = two_rank_results
    want = reference_run["logp"]
    for key in ("old_log_probs", "entropys"):
        got = torch.cat([r["logp"][key] for r in ranks])
        assert torch.allclose(got, want[key], atol=ATOL, rtol=0), key
    dynamic = torch.cat([r["logp_dynamic"] for r in ranks])
    assert torch.allclose(dynamic, want["old_log_probs"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("scenario", ["micro2", "micro1", "dynamic", "hsdp"])
def test_training_matches_reference(two_rank_results, reference_run, scenario):
    """3 optimizer steps: every rank reports the global loss and grad norm; weights equal the reference."""
    _, ranks = two_rank_results
    for r in ranks:
        _assert_metrics_match(r[f"{scenario}_metrics"], reference_run["metrics"])
        assert _max_abs(r[f"{scenario}_weights"], reference_run["weights"]) < ATOL
    initial = dict(_reference_initial_weights(reference_run))
    assert _max_abs(initial, reference_run["weights"]) > 1e-3  # the steps did move the weights


def _reference_initial_weights(reference_run):
    from verl.testing.tiny import make_tiny_model

    return make_tiny_model(seed=1).state_dict().items()


def test_token_mean_is_global_across_uneven_ranks(two_rank_results, reference_run, scenarios):
    """Rank 0 holds 29 response tokens, rank 1 holds 4: the loss is the global token mean, not a mean of means."""
    _, ranks = two_rank_results
    full = reference_run["batch"]
    mask = full.batch["response_mask"].double()
    term = -full.batch["advantages"].double() * reference_run["logp"]["old_log_probs"].double() * mask
    global_mean = float(term.sum() / mask.sum())
    half = scenarios.ROWS // 2
    mean_of_means = float(sum(term[i : i + half].sum() / mask[i : i + half].sum() for i in (0, half)) / 2)
    assert abs(global_mean - mean_of_means) > 0.05  # the batch really is uneven
    for r in ranks:
        assert r["micro2_metrics"][0]["test/loss"][0] == pytest.approx(global_mean, rel=1e-5)


def test_micro_batch_counts_are_equalised(two_rank_results):
    """Dynamic bsz plans 2 micro-batches on rank 0 and 1 on rank 1; both run 2 (no deadlock)."""
    _, ranks = two_rank_results
    assert [r["dynamic_local_plan_len"] for r in ranks] == [2, 1]
    assert [r["dynamic_plan_len"] for r in ranks] == [2, 2]
    assert [r["micro1_plan_len"] for r in ranks] == [4, 4]
    assert ranks[0]["hsdp_mesh"] == [2, 1]


@pytest.fixture(scope="module")
def reference_ppo(two_rank_results, scenarios):
    out, _ = two_rank_results
    model_dir = str(out / "tiny_model")
    cfg = scenarios.ppo_config(model_dir, "reference")
    spec = get_plugin_manager().get("training_engine", "reference")
    engine = build_training_engine(spec, cfg, model=model_dir, total_training_steps=10)
    full = scenarios.make_batch()
    metrics = scenarios.train(engine, full, make_ppo_loss(cfg.actor_rollout_ref.actor))
    ref = build_training_engine(spec, cfg, role="ref", model=model_dir)
    ref_logp = ref.compute_log_prob(full).batch["old_log_probs"]
    return {"metrics": metrics, "weights": scenarios.weights(engine), "ref_logp": ref_logp}


ADDITIVE_PPO_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/grad_norm", "actor/lr")


def test_ppo_loss_through_factory_matches_reference(two_rank_results, reference_ppo):
    """verl's PPO loss (seq-mean-token-mean, gradient checkpointing on) built by the plugin's factory."""
    _, ranks = two_rank_results
    for r in ranks:
        assert _max_abs(r["ppo_weights"], reference_ppo["weights"]) < ATOL
        for got, want in zip(r["ppo_metrics"], reference_ppo["metrics"], strict=True):
            for key in ADDITIVE_PPO_METRICS:
                assert got[key] == pytest.approx(want[key], rel=RTOL), key
    ref_logp = torch.cat([r["ref_logp"] for r in ranks])
    assert torch.allclose(ref_logp, reference_ppo["ref_logp"], atol=ATOL, rtol=0)


def test_ppo_loss_metrics_are_additive_over_ranks(two_rank_results, reference_ppo):
    """pg_loss/loss are reported without agg_loss's x dp_size (make_ppo_loss), so the rank sum is the global value."""
    _, ranks = two_rank_results
    for r in ranks:
        for got, want in zip(r["ppo_metrics"], reference_ppo["metrics"], strict=True):
            for key in ("actor/pg_loss", "actor/loss"):
                assert got[key] == pytest.approx(want[key], rel=RTOL), key
