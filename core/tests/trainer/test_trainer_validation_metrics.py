"""Validation metrics: verl's mean@N / best@k / worst@k / maj@k bootstrap and the val-core / val-aux split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from verl.trainer.validation import compute_validation_metrics


def _verl_bootstrap(values, k, fn, seed=42, n_bootstrap=1000):
    """verl's bootstrap_metric, written out with numpy's global legacy RNG as verl does."""
    np.random.seed(seed)
    out = []
    for _ in range(n_bootstrap):
        idx = np.random.choice(len(values), size=k, replace=True)
        out.append(fn([values[i] for i in idx]))
    return float(np.mean(out)), float(np.std(out))


def _majority(pairs):
    counts = Counter(p for _, p in pairs)
    top = max(counts.values())
    winner = next(p for _, p in pairs if counts[p] == top)  # first seen among the most frequent
    return next(v for v, p in pairs if p == winner)


def test_single_response_per_prompt_gives_mean_at_1_only() -> None:
    records = {"data_source": ["gsm8k"] * 3, "uid": ["a", "b", "c"], "score": [1.0, 0.1, 0.0], "acc": [1.0, 0, 0]}
    out = compute_validation_metrics(records)
    assert out == {
        "val-core/gsm8k/acc/mean@1": pytest.approx(1 / 3),
        "val-aux/gsm8k/reward/mean@1": pytest.approx(1.1 / 3),
    }


def test_best_worst_and_maj_follow_verl_bootstrap() -> None:
    # One prompt, 4 responses: scores and extracted answers.
    acc = [1.0, 0.0, 1.0, 0.0]
    pred = ["72", "70", "72", "9"]
    records = {"data_source": ["gsm8k"] * 4, "uid": ["p"] * 4, "score": acc, "acc": acc, "pred": pred}
    out = compute_validation_metrics(records)
    assert out["val-core/gsm8k/acc/mean@4"] == pytest.approx(0.5)
    assert out["val-aux/gsm8k/acc/std@4"] == pytest.approx(0.5)
    for k in (2, 4):
        best = _verl_bootstrap(acc, k, max)
        worst = _verl_bootstrap(acc, k, min)
        pairs = list(zip(acc, pred, strict=True))
        maj = _verl_bootstrap(pairs, k, _majority)
        core = "val-core" if k == 4 else "val-aux"
        assert out[f"{core}/gsm8k/acc/best@{k}/mean"] == pytest.approx(best[0])
        # verl: every best@N / maj@N entry of the core variable (std too) is val-core.
        assert out[f"{core}/gsm8k/acc/best@{k}/std"] == pytest.approx(best[1])
        assert out[f"val-aux/gsm8k/acc/worst@{k}/mean"] == pytest.approx(worst[0])
        assert out[f"{core}/gsm8k/acc/maj@{k}/mean"] == pytest.approx(maj[0])
    # Analytic sanity: with p = 1/2 correct, best@k -> 1 - 2^-k and worst@k -> 2^-k (bootstrap noise ~0.02).
    assert out["val-aux/gsm8k/acc/best@2/mean"] == pytest.approx(0.75, abs=0.04)
    assert out["val-aux/gsm8k/acc/worst@2/mean"] == pytest.approx(0.25, abs=0.04)
    assert "val-aux/gsm8k/reward/mean@4" in out and not any("/pred/" in k for k in out)


def test_metrics_average_over_prompts_and_split_by_data_source() -> None:
    records = {
        "data_source": ["a", "a", "a", "a", "b", "b"],
        "uid": ["p1", "p1", "p2", "p2", "q", "q"],
        "score": [1.0, 1.0, 0.0, 1.0, 0.0, 0.0],
    }
    out = compute_validation_metrics(records)
    # No acc reported: the core variable is the reward; prompt means 1.0 and 0.5 average to 0.75.
    assert out["val-core/a/reward/mean@2"] == pytest.approx(0.75)
    assert out["val-aux/a/reward/std@2"] == pytest.approx((0.0 + 0.5) / 2)
    assert out["val-core/b/reward/best@2/mean"] == 0.0
    assert out["val-core/b/reward/mean@2"] == 0.0


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        compute_validation_metrics({"data_source": ["a"], "uid": ["p", "q"], "score": [1.0]})
