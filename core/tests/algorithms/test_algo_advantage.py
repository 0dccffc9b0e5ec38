"""Advantage estimators against hand-written numpy references, and K01-K03 for every group estimator."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.algorithms import (
    compute_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)

RNG = np.random.default_rng(7)


def t(x):
    return torch.tensor(np.asarray(x, dtype=np.float64))


def outcome(scores, width=3, lens=None):
    """Rewards with the score on the last valid token; mask of the given lengths."""
    n = len(scores)
    lens = [width] * n if lens is None else lens
    r = np.zeros((n, width))
    m = np.zeros((n, width))
    for i, (s, L) in enumerate(zip(scores, lens, strict=True)):
        m[i, :L] = 1
        if L:
            r[i, L - 1] = s
    return r, m


def groups_of(index):
    out = {}
    for i, g in enumerate(index):
        out.setdefault(g, []).append(i)
    return out.values()


# ---------------------------------------------------------------------------------------- numpy references
def np_grpo(s, index, eps=1e-6, norm=True):
    out = np.zeros_like(s)
    for rows in groups_of(index):
        x = s[rows]
        mean, std = (0.0, 1.0) if len(rows) == 1 else (x.mean(), x.std(ddof=1))
        out[rows] = (x - mean) / (std + eps) if norm else x - mean
    return out


def np_rloo(s, index):
    out = s.copy()
    for rows in groups_of(index):
        n = len(rows)
        if n > 1:
            for i in rows:
                out[i] = s[i] - (s[rows].sum() - s[i]) / (n - 1)
    return out


def np_opo(s, lens, index):
    out = s.copy()
    for rows in groups_of(index):
        if len(rows) > 1:
            out[rows] = s[rows] - (lens[rows] * s[rows]).sum() / lens[rows].sum()
    return out


def np_gpg(s, index):
    alpha = len(s) / max(1, np.count_nonzero(s))
    out = s.copy()
    for rows in groups_of(index):
        if len(rows) > 1:
            out[rows] = s[rows] - s[rows].mean()
    return alpha * out


def np_passk(s, index, eps=1e-6, norm=True):
    out = np.zeros_like(s)
    for rows in groups_of(index):
        order = sorted(rows, key=lambda i: -s[i])
        gap = s[order[0]] - s[order[1]]
        out[order[0]] = gap / (s[rows].std(ddof=1) + eps) if norm else gap
    return out


def np_whiten(x, m):
    sel = x[m.astype(bool)]
    return (x - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8) * m


def np_gae(r, v, m, gamma, lam):
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        next_v, last = 0.0, 0.0
        for k in reversed(range(r.shape[1])):
            if m[b, k]:
                last = r[b, k] + gamma * next_v - v[b, k] + gamma * lam * last
                next_v = v[b, k]
            adv[b, k] = last
    return np_whiten(adv, m), (adv + v) * m


def np_discounted(r, m, gamma):
    out = np.zeros_like(r)
    for b in range(r.shape[0]):
        g = 0.0
        for k in reversed(range(r.shape[1])):
            if m[b, k]:
                g = r[b, k] + gamma * g
            out[b, k] = g
    return out * m


SCORES = np.array([0.3, 1.7, -0.4, 2.2, 0.9, 1.1, -1.3])
INDEX = np.array(["a", "a", "a", "b", "b", "c", "d"], dtype=object)  # sizes 3, 2, 1, 1
LENS = np.array([3, 1, 2, 3, 2, 1, 3])


# ------------------------------------------------------------------------------------------ value tests
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_numpy(norm):
    r, m = outcome(SCORES, lens=LENS)
    adv, ret = compute_grpo_outcome_advantage(t(r), t(m), INDEX, norm_adv_by_std_in_grpo=norm)
    expected = np_grpo(SCORES, INDEX, norm=norm)[:, None] * m
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10)
    assert torch.equal(adv, ret)


def test_grpo_keeps_dtype_and_accepts_int_index_and_bool_mask():
    r, m = outcome(SCORES)
    adv, _ = compute_grpo_outcome_advantage(
        torch.tensor(r, dtype=torch.float32), torch.tensor(m, dtype=torch.bool), np.array([0, 0, 0, 1, 1, 2, 3])
    )
    assert adv.dtype == torch.float32
    np.testing.assert_allclose(adv.numpy(), np_grpo(SCORES, INDEX)[:, None] * m, rtol=1e-5)


def test_rloo_matches_numpy():
    r, m = outcome(SCORES, lens=LENS)
    adv, _ = compute_rloo_outcome_advantage(t(r), t(m), INDEX)
    np.testing.assert_allclose(adv.numpy(), np_rloo(SCORES, INDEX)[:, None] * m, rtol=1e-10)


def test_opo_matches_numpy():
    r, m = outcome(SCORES, lens=LENS)
    adv, _ = compute_opo_outcome_advantage(t(r), t(m), INDEX)
    np.testing.assert_allclose(adv.numpy(), np_opo(SCORES, LENS.astype(float), INDEX)[:, None] * m, rtol=1e-10)


def test_gpg_matches_numpy():
    scores = np.array([0.0, 1.0, 0.0, 2.0, 0.0, 1.5, 3.0])
    r, m = outcome(scores, lens=LENS)
    adv, _ = compute_gpg_outcome_advantage(t(r), t(m), INDEX)
    np.testing.assert_allclose(adv.numpy(), np_gpg(scores, INDEX)[:, None] * m, rtol=1e-10)
    half, _ = compute_gpg_outcome_advantage(t(r), t(m), INDEX, f_norm=2.0)
    np.testing.assert_allclose(half.numpy(), adv.numpy() / 2)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_matches_numpy(norm):
    scores, index = SCORES[:5], INDEX[:5]
    r, m = outcome(scores, lens=LENS[:5])
    cfg = {"norm_adv_by_std_in_grpo": norm}
    adv, _ = compute_grpo_passk_outcome_advantage(t(r), t(m), index, config=cfg)
    np.testing.assert_allclose(adv.numpy(), np_passk(scores, index, norm=norm)[:, None] * m, rtol=1e-10)


def test_grpo_passk_rejects_group_of_one():
    r, m = outcome([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="at least 2"):
        compute_grpo_passk_outcome_advantage(t(r), t(m), np.array(["a", "a", "b"]))


def test_rpp_baseline_matches_numpy():
    r, m = outcome(SCORES, lens=LENS)
    centred = np.zeros_like(SCORES)
    for rows in groups_of(INDEX):
        centred[rows] = SCORES[rows] - (SCORES[rows].mean() if len(rows) > 1 else 0.0)
    expected = np_whiten(centred[:, None] * m, m)
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(t(r), t(m), INDEX)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-9)


def test_gae_matches_numpy_including_interior_masked_tokens():
    r = RNG.normal(size=(3, 6))
    v = RNG.normal(size=(3, 6))
    m = np.array([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=float)
    adv, ret = compute_gae_advantage_return(t(r), t(v), t(m), gamma=0.9, lam=0.8)
    exp_adv, exp_ret = np_gae(r, v, m, 0.9, 0.8)
    np.testing.assert_allclose(adv.numpy(), exp_adv, rtol=1e-10)
    np.testing.assert_allclose(ret.numpy(), exp_ret, rtol=1e-10)


def test_gae_by_hand_single_row():
    # r = [0, 1], V = [0.5, 0.2], gamma = lam = 1: A1 = 1 - 0.2 = 0.8 ; A0 = 0 + 0.2 - 0.5 + 0.8 = 0.5
    adv, ret = compute_gae_advantage_return(t([[0.0, 1.0]]), t([[0.5, 0.2]]), t([[1, 1]]), gamma=1.0, lam=1.0)
    np.testing.assert_allclose(ret.numpy(), [[1.0, 1.0]])
    raw = np.array([0.5, 0.8])
    np.testing.assert_allclose(adv.numpy()[0], (raw - raw.mean()) / np.sqrt(raw.var(ddof=1) + 1e-8))


def test_reinforce_plus_plus_matches_numpy_and_ignores_masked_rewards():
    r = RNG.normal(size=(2, 5))
    m = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], dtype=float)
    cfg = SimpleNamespace(gamma=0.7)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(t(r), t(m), config=cfg)
    exp_ret = np_discounted(r, m, 0.7)
    np.testing.assert_allclose(ret.numpy(), exp_ret, rtol=1e-10)
    np.testing.assert_allclose(adv.numpy(), np_whiten(exp_ret, m), rtol=1e-9)
    noisy = r.copy()
    noisy[m == 0] = 1e6
    adv2, _ = compute_reinforce_plus_plus_outcome_advantage(t(noisy), t(m), config=cfg)
    np.testing.assert_allclose(adv2.numpy(), adv.numpy())


def test_remax_matches_numpy():
    r = RNG.normal(size=(2, 4))
    m = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=float)
    b = np.array([0.3, -0.2])
    adv, ret = compute_remax_outcome_advantage(t(r), t(b), t(m))
    exp_ret = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1) * m
    np.testing.assert_allclose(ret.numpy(), exp_ret, rtol=1e-10)
    np.testing.assert_allclose(adv.numpy(), (exp_ret - b[:, None]) * m, rtol=1e-10)
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_remax_outcome_advantage(t(r), t([1.0]), t(m))


# ------------------------------------------------------------------------------------------ K01 - K03
def test_k01_grpo_statistics_are_per_group():
    r, m = outcome([1, 0, 1, 1])
    adv, _ = compute_grpo_outcome_advantage(t(r), t(m), np.array(["a", "a", "b", "b"]), epsilon=1e-6)
    np.testing.assert_allclose(adv[:, -1].numpy(), [0.70711, -0.70711, 0.0, 0.0], atol=1e-5)
    r2, _ = outcome([1, 0, -5, 40])
    adv2, _ = compute_grpo_outcome_advantage(t(r2), t(m), np.array(["a", "a", "b", "b"]))
    assert torch.equal(adv2[:2], adv[:2])  # other prompts' scores never move group a


def test_k02a_group_of_one():
    r, m = outcome([1.0])
    adv, _ = compute_grpo_outcome_advantage(t(r), t(m), np.array(["a"]), epsilon=1e-6)
    np.testing.assert_allclose(adv.numpy(), [[0.999999, 0.999999, 0.999999]], rtol=1e-9)
    assert adv[0, 0].item() == pytest.approx(1 / (1 + 1e-6), rel=1e-12)


@pytest.mark.parametrize("eps", [1e-6, 0.0])
@pytest.mark.parametrize("value", [1.0, 0.1, 1e-3])
def test_k02bc_equal_scores_give_exact_zero_even_with_epsilon_zero(eps, value):
    r, m = outcome([value] * 4)
    adv, _ = compute_grpo_outcome_advantage(t(r), t(m), np.array(["a"] * 4), epsilon=eps)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_k03a_rejected_row_leaves_its_group():
    r = t([[0, 0, 100], [0, 0, 1]])
    m = t([[0, 0, 0], [1, 1, 1]])
    adv, _ = compute_grpo_outcome_advantage(r, m, np.array(["a", "a"]), epsilon=1e-6)
    np.testing.assert_allclose(adv.numpy(), [[0, 0, 0], [0.999999, 0.999999, 0.999999]], rtol=1e-9)
    dr, _ = compute_grpo_outcome_advantage(r, m, np.array(["a", "a"]), norm_adv_by_std_in_grpo=False)
    np.testing.assert_allclose(dr.numpy(), [[0, 0, 0], [1, 1, 1]])


def test_k03b_masked_reward_is_ignored():
    r = t([[0, 1], [0, 0]])
    m = t([[1, 0], [1, 1]])
    adv, _ = compute_grpo_outcome_advantage(r, m, np.array(["a", "a"]), epsilon=1e-6)
    assert torch.equal(adv, torch.zeros(2, 2, dtype=torch.float64))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_k03b_non_finite_reward_outside_the_mask_does_not_leak(bad, mask_dtype):
    """The fast row sum multiplies by the mask (NaN * 0 = NaN); such rows are summed again over their valid
    positions only, so the result equals that of the same rewards with 0 there, for every mask dtype."""
    rng = np.random.default_rng(3)
    r = torch.tensor(rng.integers(0, 2, (6, 5)), dtype=torch.float32)
    m = torch.tensor([[1, 1, 1, 0, 0]] * 3 + [[1, 1, 1, 1, 1]] * 3).to(mask_dtype)
    clean = r.clone()
    clean[:3, 3:] = 0
    dirty = clean.clone()
    dirty[1, 4] = bad
    index = np.array(["a", "a", "a", "b", "b", "b"])
    want, _ = compute_grpo_outcome_advantage(clean, m, index)
    got, returns = compute_grpo_outcome_advantage(dirty, m, index)
    assert torch.isfinite(got).all() and torch.equal(got, want)
    assert returns is got  # one tensor for both, as verl's estimators return it


def _call(name, r, m, index, eps=1e-6):
    fns = {
        "grpo": lambda: compute_grpo_outcome_advantage(r, m, index, epsilon=eps),
        "drgrpo": lambda: compute_grpo_outcome_advantage(r, m, index, epsilon=eps, norm_adv_by_std_in_grpo=False),
        "grpo_passk": lambda: compute_grpo_passk_outcome_advantage(r, m, index, epsilon=eps),
        "rloo": lambda: compute_rloo_outcome_advantage(r, m, index),
        "rpp_baseline": lambda: compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, index),
        "opo": lambda: compute_opo_outcome_advantage(r, m, index),
        "gpg": lambda: compute_gpg_outcome_advantage(r, m, index),
    }
    return fns[name]()[0]


GROUP_ESTIMATORS = ["grpo", "drgrpo", "grpo_passk", "rloo", "rpp_baseline", "opo", "gpg"]


@pytest.mark.parametrize("name", GROUP_ESTIMATORS + ["grpo_vectorized"])
def test_mask_dtype_changes_no_result(name):
    """Fast path (the mask converted once to the rewards' dtype, issue #22): a 0/1 mask given as int64 (verl's),
    bool or float32 gives bit-identical advantages, equal to the float64 computation, on a float32 batch with
    several lengths, a fully masked row and a reward left outside the mask."""
    rng = np.random.default_rng(7)
    rows, length = 24, 9
    lens = rng.integers(1, length + 1, rows)
    lens[5] = 0
    m = (np.arange(length)[None, :] < lens[:, None]).astype(np.int64)
    r = np.zeros((rows, length))
    r[np.arange(rows), np.maximum(lens - 1, 0)] = rng.integers(0, 3, rows) / 2
    r[7, -1] = 5.0 if m[7, -1] == 0 else r[7, -1]
    index = np.repeat(np.array([f"g{i}" for i in range(rows // 4)], dtype=object), 4)
    r32 = torch.tensor(r, dtype=torch.float32)
    if name == "grpo_vectorized":
        from verl.algorithms import get_adv_estimator_fn

        fn = get_adv_estimator_fn("grpo_vectorized")
        results = {d: fn(r32, torch.tensor(m).to(d), index)[0] for d in (torch.int64, torch.bool, torch.float32)}
        ref = fn(torch.tensor(r), torch.tensor(m, dtype=torch.float64), index)[0]
    else:
        results = {d: _call(name, r32, torch.tensor(m).to(d), index) for d in (torch.int64, torch.bool, torch.float32)}
        ref = _call(name, torch.tensor(r), torch.tensor(m, dtype=torch.float64), index)
    base = results[torch.int64]
    assert base.dtype == torch.float32
    for dtype, got in results.items():
        assert torch.equal(got, base), dtype
    np.testing.assert_allclose(base.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)
    assert torch.count_nonzero(base[5]) == 0


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_k03_every_group_estimator_drops_rejected_rows_and_masked_rewards(name):
    # group a: 3 rows, row 1 fully rejected (mask 0) with a huge reward; group b: 2 rows
    r = np.array([[0, 0, 1.0], [0, 0, 100.0], [0, 0.5, 0], [0, 0, 2.0], [0, 3.0, 0]])
    m = np.array([[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=float)
    index = np.array(["a", "a", "a", "b", "b"], dtype=object)
    adv = _call(name, t(r), t(m), index)
    assert torch.equal(adv[1], torch.zeros(3, dtype=torch.float64))
    keep = [0, 2, 3, 4]
    alone = _call(name, t(r[keep]), t(m[keep]), index[keep])
    np.testing.assert_allclose(adv[keep].numpy(), alone.numpy(), rtol=1e-12, atol=1e-15)
    noisy = r.copy()
    noisy[m == 0] = -777.0  # rewards outside the mask must not matter
    np.testing.assert_allclose(_call(name, t(noisy), t(m), index).numpy(), adv.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_k02_every_group_estimator_is_finite_on_equal_and_single_groups(name, eps):
    r, m = outcome([0.1, 0.1, 0.1, 0.7, 0.7, 2.0], lens=[3, 2, 1, 3, 3, 3])
    index = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    if name == "grpo_passk":
        index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    adv = _call(name, t(r), t(m), index, eps=eps)
    assert torch.isfinite(adv).all()
    equal_rows = adv[:3] if name == "grpo_passk" else adv[:5]  # rows of the all-equal groups
    if name != "rpp_baseline":  # whitening shifts everything by the batch mean
        assert torch.equal(equal_rows, torch.zeros_like(equal_rows))


def test_index_errors():
    r, m = outcome([1.0, 2.0])
    with pytest.raises(ValueError, match="2 rows"):
        compute_grpo_outcome_advantage(t(r), t(m), np.array(["a"]))
    with pytest.raises(ValueError, match="index"):
        compute_grpo_outcome_advantage(t(r), t(m), None)
    with pytest.raises(TypeError, match="hashable"):
        compute_grpo_outcome_advantage(t(r), t(m), [["a"], ["b"]])


# ------------------------------------------------------------------------------------------ driver
def fake_data(batch, uid=None):
    return SimpleNamespace(batch=dict(batch), non_tensor_batch={} if uid is None else {"uid": uid})


def test_compute_advantage_grpo_and_registry_estimators():
    r, m = outcome(SCORES, lens=LENS)
    data = compute_advantage(fake_data({"token_level_rewards": t(r), "response_mask": t(m)}, INDEX), "grpo")
    np.testing.assert_allclose(data.batch["advantages"].numpy(), np_grpo(SCORES, INDEX)[:, None] * m, rtol=1e-10)
    data = compute_advantage(fake_data({"token_level_rewards": t(r), "response_mask": t(m)}, INDEX), "rloo")
    np.testing.assert_allclose(data.batch["returns"].numpy(), np_rloo(SCORES, INDEX)[:, None] * m, rtol=1e-10)
    data = compute_advantage(
        fake_data({"token_level_rewards": t(r), "response_mask": t(m)}, INDEX), "grpo", norm_adv_by_std_in_grpo=False
    )
    np.testing.assert_allclose(data.batch["advantages"].numpy(), np_grpo(SCORES, INDEX, norm=False)[:, None] * m)


def test_compute_advantage_gae_rpp_remax_and_response_mask_derivation():
    r = RNG.normal(size=(2, 3))
    v = RNG.normal(size=(2, 3))
    attn = np.array([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=float)  # prompt 2 + response 3
    m = attn[:, -3:]
    batch = {"token_level_rewards": t(r), "values": t(v), "attention_mask": t(attn), "responses": torch.zeros(2, 3)}
    data = compute_advantage(fake_data(batch), "gae", gamma=0.9, lam=0.5)
    np.testing.assert_allclose(data.batch["response_mask"].numpy(), m)
    exp_adv, exp_ret = np_gae(r, v, m, 0.9, 0.5)
    np.testing.assert_allclose(data.batch["advantages"].numpy(), exp_adv, rtol=1e-10)
    np.testing.assert_allclose(data.batch["returns"].numpy(), exp_ret, rtol=1e-10)
    data = compute_advantage(
        fake_data({"token_level_rewards": t(r), "response_mask": t(m)}), "reinforce_plus_plus", gamma=0.5
    )
    np.testing.assert_allclose(data.batch["returns"].numpy(), np_discounted(r, m, 0.5), rtol=1e-10)
    b = np.array([0.1, 0.2])
    data = compute_advantage(
        fake_data({"token_level_rewards": t(r), "response_mask": t(m), "reward_baselines": t(b)}), "remax"
    )
    exp_ret = np.flip(np.cumsum(np.flip(r * m, -1), -1), -1) * m
    np.testing.assert_allclose(data.batch["advantages"].numpy(), (exp_ret - b[:, None]) * m, rtol=1e-10)


def test_compute_advantage_errors():
    with pytest.raises(KeyError, match="token_level_rewards"):
        compute_advantage(fake_data({"response_mask": torch.ones(1, 2)}), "grpo")
    with pytest.raises(KeyError, match="uid"):
        compute_advantage(
            fake_data({"token_level_rewards": torch.ones(1, 2), "response_mask": torch.ones(1, 2)}), "grpo"
        )
    with pytest.raises(KeyError, match="values"):
        compute_advantage(
            fake_data({"token_level_rewards": torch.ones(1, 2), "response_mask": torch.ones(1, 2)}), "gae"
        )
    with pytest.raises(ValueError, match="grpo"):
        compute_advantage(
            fake_data({"token_level_rewards": torch.ones(1, 2), "response_mask": torch.ones(1, 2)}), "nope"
        )


def test_compute_advantage_on_a_real_dataproto():
    protocol = pytest.importorskip("verl.protocol")
    r, m = outcome([1, 0, 1, 1])
    data = protocol.DataProto.from_dict(
        tensors={"token_level_rewards": t(r), "response_mask": t(m)},
        non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    out = compute_advantage(data, "grpo")
    np.testing.assert_allclose(out.batch["advantages"][:, -1].numpy(), [0.70711, -0.70711, 0, 0], atol=1e-5)


# ------------------------------------------------------------------------------------------ integer rewards
def _all_estimators(r, m, index):
    """Every built-in estimator on the same (rewards, mask, index); GAE gets zero values, ReMax a zero baseline."""
    zeros_v = torch.zeros(r.shape, dtype=torch.float32)
    cfg = SimpleNamespace(gamma=1.0)
    return {
        "grpo": compute_grpo_outcome_advantage(r, m, index)[0],
        "drgrpo": compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=False)[0],
        "grpo_passk": compute_grpo_passk_outcome_advantage(r, m, index)[0],
        "rloo": compute_rloo_outcome_advantage(r, m, index)[0],
        "rpp_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, index)[0],
        "opo": compute_opo_outcome_advantage(r, m, index)[0],
        "gpg": compute_gpg_outcome_advantage(r, m, index)[0],
        "gae": compute_gae_advantage_return(r, zeros_v, m, gamma=1.0, lam=1.0)[0],
        "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage(r, m, config=cfg)[0],
        "remax": compute_remax_outcome_advantage(r, torch.zeros(r.shape[0], dtype=torch.float32), m)[0],
    }


def test_integer_rewards_are_not_truncated_in_grpo():
    # Scores 1 and 0 in one group: mean 0.5, sample std sqrt(0.5) -> ±0.5/(0.70711 + 1e-6) = ±0.70711;
    # integer arithmetic would silently give 0.
    adv, ret = compute_grpo_outcome_advantage(torch.tensor([[0, 1], [0, 0]]), torch.ones(2, 2), np.array(["a", "a"]))
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(adv.numpy(), [[a, a], [-a, -a]], rtol=1e-6)
    assert a == pytest.approx(0.70711, abs=1e-5)


@pytest.mark.parametrize("int_dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_every_estimator_promotes_integer_rewards_to_float32(int_dtype):
    # Two groups of 3 with 0/1 outcome rewards on the last valid token; one row of group b is shorter.
    r = np.array([[0, 0, 1], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0], [0, 0, 0]])
    m = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]])
    index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    mask = torch.tensor(m, dtype=torch.float32)
    got = _all_estimators(torch.tensor(r).to(int_dtype), mask, index)
    want = _all_estimators(torch.tensor(r, dtype=torch.float32), mask, index)
    for name, adv in got.items():
        assert adv.dtype == torch.float32, name
        torch.testing.assert_close(adv, want[name], rtol=0, atol=0, msg=name)
    # Independent spot check: GRPO group a scores [1, 0, 1] -> mean 2/3, std sqrt(1/3).
    s = np.array([1.0, 0.0, 1.0])
    expected = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(got["grpo"][:3, 0].numpy(), expected, rtol=1e-6)
    assert float(got["rloo"][0, 0]) == pytest.approx(1 - 0.5)  # 1 minus the mean of the others [0, 1]


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.bool, torch.float32])
@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_cpu_row_scores_change_no_result(monkeypatch, mask_dtype, threads):
    """Fast path (issue #22): the CPU's block-by-block conversion, product and row sums give bit-identical scores,
    valid flags and mask to the whole-tensor ops, on dense random float32 rewards, a non-contiguous mask (a slice
    of a wider attention mask, as verl's response_mask) and a row count that is not a multiple of the block; the
    caller's mask is left untouched and only the estimator's own converted copy may be reused for the output."""
    from verl.algorithms import _groups

    monkeypatch.setattr(_groups, "_BLOCK_BYTES_PER_THREAD", 3 * 64 * 4)  # 3 rows of 64 float32 per thread
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(37, 64, generator=gen)
    wide = (torch.rand(37, 80, generator=gen) < 0.7).to(mask_dtype)
    mask = wide[:, 16:]
    mask[4] = 0
    before = mask.clone()
    rows = _groups.outcome_rows(rewards, mask)
    dense_mask = mask.to(torch.float32)
    assert torch.equal(rows.mask, dense_mask)
    assert torch.equal(rows.scores, (rewards * dense_mask).sum(dim=-1).to(torch.float64))
    assert torch.equal(rows.valid, dense_mask.sum(dim=-1) != 0) and not bool(rows.valid[4])
    assert rows.mask_is_copy == (mask_dtype != torch.float32)
    index = np.repeat(np.arange(37 // 4 + 1), 4)[:37]
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert torch.equal(mask, before)
    monkeypatch.setattr(_groups, "_BLOCK_BYTES_PER_THREAD", 1 << 40)  # whole-tensor path
    want, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    assert torch.equal(adv, want)
