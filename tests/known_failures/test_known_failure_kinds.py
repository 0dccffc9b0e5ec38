"""The *kinds* of fault behind K01..K22, over every code path that can make them (issue 6: fix the kind, not
the listed input). Property and parametrized tests through the public API; derandomized hypothesis.

* ADV (K01-K03): every registered advantage estimator, on groups of one, all-equal groups, empty rows and
  extreme scores, gives finite values; empty rows get exactly 0; all-equal groups of >= 2 get exactly 0.
* normalisers (K02): whitening guards a zero spread; GRPO with epsilon 0 never divides by zero.
* LOSS/PAD (K04, K05, K08): every aggregation mode, every policy loss and the value loss are finite with
  empty rows and all-empty masks; empty rows get zero gradient; splitting rows never changes the sum.
* REW (K14, K15): the GSM8K scorer over generated number formats (sign, "+", Unicode minus, "$", thousands
  separators, ".00", trailing text) scores the right number 1 and the negated number 0.
* REW (K16): \\boxed{} with arbitrarily nested braces extracts exactly its content.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    LOSS_AGG_MODES,
    POLICY_LOSS_REGISTRY,
    agg_loss,
    compute_advantage,
    compute_global_batch_info,
    compute_grpo_outcome_advantage,
    compute_value_loss,
    get_policy_loss_fn,
    masked_whiten,
)
from verl.config import load_config
from verl.protocol import DataProto
from verl.rewards import default_compute_score
from verl.rewards.math import extract_boxed_answer


def gsm8k_score(*args, **kwargs) -> float:
    """``default_compute_score`` for GSM8K as a float: verl's contract allows ``float`` or ``{"score": ...}``."""
    out = default_compute_score(*args, **kwargs)
    return float(out["score"]) if isinstance(out, dict) else float(out)


PROPS = settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
WIDTH = 3
# Estimators that compare a response with its group (their all-equal groups of >= 2 must give exactly 0;
# gdpo is not one: it whitens the summed components over the whole batch, as verl).
GROUP_ZERO = {"grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo", "gpg"}
SCORES = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 1e6, -1e-9, 3.0])


@st.composite
def groups(draw: st.DrawFn) -> list[tuple[str, float, list[int]]]:
    """1-4 groups: (uid, one score shared by the group, valid lengths 0..WIDTH of its 1-4 rows)."""
    out = []
    for g in range(draw(st.integers(1, 4))):
        lens = draw(st.lists(st.integers(0, WIDTH), min_size=1, max_size=4))
        out.append((f"u{g}", draw(SCORES), lens))
    return out


def _batch(spec: list[tuple[str, float, list[int]]]) -> DataProto:
    rows = [(uid, score, n) for uid, score, lens in spec for n in lens]
    rewards = np.zeros((len(rows), WIDTH))
    mask = np.zeros((len(rows), WIDTH))
    for i, (_, score, n) in enumerate(rows):
        mask[i, :n] = 1
        if n:
            rewards[i, n - 1] = score
    scores = np.array([s for _, s, _ in rows])
    # What the estimators beyond token_level_rewards read: the old policy's log-probs and sum of squared
    # probabilities (optimal token baselines; pi = 0.5 on a two-token vocabulary) and gdpo's reward component.
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor(rewards),
            "response_mask": torch.tensor(mask),
            "values": torch.zeros(len(rows), WIDTH, dtype=torch.float64),
            "reward_baselines": torch.tensor(scores),
            "old_log_probs": torch.full((len(rows), WIDTH), float(np.log(0.5)), dtype=torch.float64),
            "sum_pi_squared": torch.full((len(rows), WIDTH), 0.5, dtype=torch.float64),
        },
        non_tensors={
            "uid": np.array([u for u, _, _ in rows], dtype=object),
            "reward_extra/acc": scores.astype(float),
        },
    )


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATOR_REGISTRY))
@given(spec=groups())
@PROPS
def test_every_estimator_is_finite_and_zero_on_equal_groups_and_empty_rows(name: str, spec) -> None:
    """K01-K03 kind: no estimator divides by a zero spread or an empty row."""
    data = _batch(spec)
    uid = data.non_tensor_batch["uid"]
    mask = data.batch["response_mask"]
    valid_per_group = {u: sum(1 for n in lens if n) for u, _, lens in spec}
    if name == "grpo_passk" and min(len(lens) for _, _, lens in spec) < 2:
        with pytest.raises(ValueError, match="at least 2 responses"):
            compute_advantage(data, name)
        return
    config = SimpleNamespace(gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True, gdpo_reward_keys=["acc"])
    adv = compute_advantage(data, name, config=config).batch["advantages"]
    assert torch.isfinite(adv).all(), adv
    empty = mask.sum(-1) == 0
    assert torch.equal(adv[empty], torch.zeros_like(adv[empty]))
    if name in GROUP_ZERO:
        for i, u in enumerate(uid):
            if valid_per_group[u] >= 2:
                assert torch.equal(adv[i], torch.zeros(WIDTH, dtype=adv.dtype)), (u, adv[i])
    if name == "remax":  # baseline == the sequence score -> exactly 0
        assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@given(value=SCORES, n=st.integers(2, 6))
@PROPS
def test_grpo_zero_spread_is_guarded_for_any_epsilon(eps: float, value: float, n: int) -> None:
    """K02 kind: an all-equal group is exactly 0 whatever the epsilon (0/0 never happens)."""
    r = torch.zeros(n, WIDTH, dtype=torch.float64)
    r[:, -1] = value
    adv, _ = compute_grpo_outcome_advantage(r, torch.ones_like(r), np.array(["a"] * n), epsilon=eps)
    assert torch.equal(adv, torch.zeros_like(adv))


@given(value=SCORES, n=st.integers(1, 6), empty=st.booleans())
@PROPS
def test_whitening_guards_zero_spread(value: float, n: int, empty: bool) -> None:
    """K02 kind (normalisers): constant values whiten to 0 on valid slots; an empty mask stays finite."""
    x = torch.full((n, WIDTH), value, dtype=torch.float64)
    mask = torch.zeros_like(x) if empty else torch.ones_like(x)
    out = masked_whiten(x, mask)
    assert torch.isfinite(out).all()
    # a zero spread gives 0 up to the rounding of the mean (x - mean ~ 1e-16 |x|, times rsqrt(1e-8) = 1e4)
    assert (out * mask).abs().max().item() <= 1e-9 * max(1.0, abs(value))


@st.composite
def masked_losses(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    lens = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5))
    values = draw(st.lists(st.floats(-5, 5), min_size=4 * len(lens), max_size=4 * len(lens)))
    mask = (np.arange(4)[None, :] < np.array(lens)[:, None]).astype(np.float64)
    return np.array(values).reshape(len(lens), 4), mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@given(case=masked_losses(), cut=st.integers(0, 5))
@PROPS
def test_every_agg_mode_is_finite_with_empty_rows_and_any_split(mode: str, case, cut: int) -> None:
    """K04/K08 kind: finite, empty rows get zero gradient, and a row split sums to the whole (global counts)."""
    loss_np, mask_np = case
    loss = torch.tensor(loss_np, requires_grad=True)
    mask = torch.tensor(mask_np)
    info = compute_global_batch_info(mask)
    whole = agg_loss(loss, mask, mode, **info)
    whole.backward()
    assert torch.isfinite(whole) and torch.isfinite(loss.grad).all()
    assert torch.equal(loss.grad[mask.sum(-1) == 0], torch.zeros_like(loss.grad[mask.sum(-1) == 0]))
    if not mask.any():
        assert whole.item() == 0.0
    cut = min(cut, len(loss_np))
    parts = [agg_loss(loss[a:b], mask[a:b], mode, **info) for a, b in ((0, cut), (cut, len(loss_np))) if b > a]
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=1e-9, abs=1e-12)


MASKS = {
    "empty-row": [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]],
    "all-empty": [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
}


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY))
def test_every_policy_loss_is_finite_with_empty_rows(name: str, mode: str, mask_name: str) -> None:
    """K08 kind: every policy loss x every aggregation mode, with an empty row or an all-empty mask."""
    overrides = [f"actor_rollout_ref.actor.loss_agg_mode={mode}"]
    if name == "dro":  # verl's dro has no default beta
        overrides.append("actor_rollout_ref.actor.policy_loss.dro_beta=0.1")
    actor = load_config(overrides=overrides).actor_rollout_ref.actor
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    new = (old + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor(MASKS[mask_name], dtype=torch.float64)
    torch.manual_seed(0)
    loss, _ = get_policy_loss_fn(name)(old, new, adv, mask, mode, actor)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    assert torch.equal(new.grad[1], torch.zeros(4, dtype=torch.float64))
    if mask_name == "all-empty":
        assert loss.item() == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_is_finite_with_empty_rows(mode: str) -> None:
    """K08 kind: the critic's value loss too."""
    vpreds = torch.tensor([[0.5, 1.0], [2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    returns = torch.tensor([[1.0, 1.0], [9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    loss, _ = compute_value_loss(vpreds, returns, vpreds.detach(), mask, cliprange_value=0.5, loss_agg_mode=mode)
    loss.backward()
    assert torch.isfinite(loss) and torch.equal(vpreds.grad[1], torch.zeros(2, dtype=torch.float64))
    empty, _ = compute_value_loss(vpreds, returns, vpreds.detach(), torch.zeros_like(mask), 0.5, mode)
    assert empty.item() == 0.0


# ------------------------------------------------------------------------------------------ REW: GSM8K formats
@st.composite
def gsm8k_answer(draw: st.DrawFn) -> tuple[str, str, float]:
    """(formatted answer, canonical truth, value): sign, "+", Unicode minus, "$", commas, ".00", decimals."""
    whole = draw(st.integers(0, 9_999_999))
    cents = draw(st.sampled_from([None, 0, 5, 25]))
    negative = draw(st.booleans())
    digits = f"{whole:,}" if whole >= 1000 and draw(st.booleans()) else str(whole)
    if cents is not None:
        digits += f".{cents:02d}" if cents in (0, 25) else f".{cents}"
    value = (whole + (0 if cents is None else cents / (100 if cents in (0, 25) else 10))) * (-1 if negative else 1)
    sign = draw(st.sampled_from(["-", "\u2212"])) if negative else draw(st.sampled_from(["", "+"]))
    dollar = draw(st.booleans())
    text = draw(st.sampled_from([f"{sign}${digits}", f"${sign}{digits}"])) if dollar else f"{sign}{digits}"
    truth = str(int(value)) if value == int(value) else repr(value)
    return text, truth, value


TRAILING = ["", ".", " dollars.", "!", " in total."]


@given(answer=gsm8k_answer(), trailing=st.sampled_from(TRAILING), method=st.sampled_from(["strict", "flexible"]))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_gsm8k_scores_every_number_format(answer: tuple[str, str, float], trailing: str, method: str) -> None:
    """K14/K15 kind: signs, "+", Unicode minus, "$", thousands separators, ".00" and trailing text."""
    text, truth, value = answer
    response = f"Step 1: 2 + 2 = 4. #### {text}{trailing}" if method == "strict" else f"So it is {text}{trailing}"
    assert gsm8k_score("openai/gsm8k", response, truth, method=method) == 1.0, (response, truth)
    if value != 0:
        negated = truth[1:] if truth.startswith("-") else "-" + truth
        assert gsm8k_score("openai/gsm8k", response, negated, method=method) == 0.0, (response, negated)


@st.composite
def nested_braces(draw: st.DrawFn) -> str:
    """Balanced LaTeX-ish content such as ``\\frac{1}{2^{10}}`` (nesting depth up to 4)."""

    def build(depth: int) -> str:
        parts = draw(st.lists(st.sampled_from(["1", "x", "\\frac", "^", "+", "-", "{}"]), min_size=1, max_size=3))
        text = "".join(parts)
        if depth and draw(st.booleans()):
            text += "{" + build(depth - 1) + "}"
        return text

    return build(4)


@given(
    content=nested_braces(), macro=st.sampled_from(["\\boxed", "\\fbox"]), prefix=st.sampled_from(["", "\\boxed{9} "])
)
@settings(max_examples=100, deadline=None, derandomize=True)
def test_boxed_extraction_handles_any_nesting(content: str, macro: str, prefix: str) -> None:
    """K16 kind: the last box's content is extracted whole, whatever the brace nesting."""
    assert extract_boxed_answer(f"{prefix}so {macro}{{{content}}} done") == content
    if not prefix:
        assert extract_boxed_answer(f"so {macro}{{{content}") is None  # unclosed: no answer, no exception
