"""Reference training engine with a POSITION-SENSITIVE model: K07 (left padding) and K09 (temperature).

The tiny Llama uses rotary embeddings, which only see relative positions, so a constant position shift
(e.g. a plain ``arange`` over left padding) goes unnoticed there. GPT-2 adds *learned absolute* position
embeddings, so every position-id mistake changes its logits: that is the model these tests use.
Expected values come from plain, unpadded single-row forwards and hand-written ``log_softmax`` maths.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.engines.reference.rollout import HFRolloutEngine
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.tiny import make_tiny_tokenizer

PAD = 3


def make_gpt2(seed: int = 0):
    """Tiny GPT2LMHeadModel (learned absolute positions), no dropout; equal seeds give identical weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = make_tiny_tokenizer()
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.2,  # large position embeddings: position errors show up clearly
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.eval()


def _engine(model=None, **kw) -> ReferenceTrainingEngine:
    settings = EngineSettings(**{"infer_micro_batch_size": None, **kw})
    return ReferenceTrainingEngine(model if model is not None else make_gpt2(), settings, optim=None)


def _batch(rows: list[tuple[list[int], list[int]]], prompt_width: int, resp_width: int, *, arange_pos=False):
    """Left-pad each prompt to ``prompt_width`` and right-pad each response to ``resp_width``."""
    bs = len(rows)
    prompts = torch.full((bs, prompt_width), PAD)
    responses = torch.full((bs, resp_width), PAD)
    pmask = torch.zeros(bs, prompt_width, dtype=torch.long)
    rmask = torch.zeros(bs, resp_width, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        prompts[i, prompt_width - len(p) :] = torch.tensor(p)
        pmask[i, prompt_width - len(p) :] = 1
        responses[i, : len(r)] = torch.tensor(r)
        rmask[i, : len(r)] = 1
    attention_mask = torch.cat([pmask, rmask], dim=1)
    if arange_pos:  # the known-wrong rule of K07
        position_ids = torch.arange(attention_mask.shape[1]).expand(bs, -1).clone()
    else:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": rmask,
        },
        meta_info={"temperature": 1.0},
    )


def _plain_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> np.ndarray:
    """Oracle: one unpadded row (positions 0..n-1), log_softmax(logits / T) in float64 at the response tokens."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double().numpy()
    out = []
    for t, token in enumerate(response):
        z = logits[len(prompt) - 1 + t] / temperature
        out.append(z[token] - (z.max() + np.log(np.exp(z - z.max()).sum())))
    return np.array(out)


# Token ids 4..103 are printable characters of the tiny tokenizer.
TEXT_A = ([10, 11, 12, 13, 14], [20, 21, 22])  # 5-token prompt, 3-token response
TEXT_B = ([30, 31, 32, 33, 34, 35, 36, 37], [40, 41, 42, 43])  # 8-token prompt, 4-token response
TEXT_D = ([50 + i for i in range(11)], [60])  # 11-token prompt


# ------------------------------------------------------------------------------------------------- K07
def test_k07_log_probs_identical_with_0_and_3_extra_left_pads():
    engine = _engine()
    # A alone (0 pads) vs A with 3 left pads next to B with 0 pads in ONE micro-batch (the 3 pad columns are
    # not shared by every row, so the engine cannot trim them away).
    alone_a = engine.compute_log_prob(_batch([TEXT_A], 5, 4)).batch["old_log_probs"]
    mixed = engine.compute_log_prob(_batch([TEXT_A, TEXT_B], 8, 4)).batch["old_log_probs"]
    # B with 0 pads (above) vs B with 3 left pads next to the unpadded D.
    padded_b = engine.compute_log_prob(_batch([TEXT_B, TEXT_D], 11, 4)).batch["old_log_probs"]
    torch.testing.assert_close(mixed[0, :3], alone_a[0, :3], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded_b[0, :4], mixed[1, :4], atol=1e-5, rtol=0)
    # ... and all of them equal the unpadded single-row oracle.
    model = engine.model
    np.testing.assert_allclose(mixed[0, :3].numpy(), _plain_log_probs(model, *TEXT_A, 1.0), atol=1e-5)
    np.testing.assert_allclose(mixed[1, :4].numpy(), _plain_log_probs(model, *TEXT_B, 1.0), atol=1e-5)
    assert torch.all(mixed[0, 3:] == 0)  # response padding holds 0


def test_k07_model_is_position_sensitive_so_the_wrong_rule_is_caught():
    # Guard on the test itself: with the known-wrong arange positions the padded row's log-probs move by far
    # more than the tolerance above, so a regression to arange cannot pass test_k07 unnoticed.
    engine = _engine()
    right = engine.compute_log_prob(_batch([TEXT_A, TEXT_B], 8, 4)).batch["old_log_probs"]
    wrong = engine.compute_log_prob(_batch([TEXT_A, TEXT_B], 8, 4, arange_pos=True)).batch["old_log_probs"]
    assert float((right[0, :3] - wrong[0, :3]).abs().max()) > 1e-2
    torch.testing.assert_close(right[1], wrong[1])  # the unpadded row has the same positions either way


def test_k07_training_forward_is_padding_invariant_too():
    # The training path (forward_micro_batch with grad) reads the same positions as compute_log_prob.
    engine = _engine(model=make_gpt2())
    alone = engine.forward_micro_batch(_batch([TEXT_A], 5, 4).batch, 1.0)["log_probs"]
    mixed = engine.forward_micro_batch(_batch([TEXT_A, TEXT_B], 8, 4).batch, 1.0)["log_probs"]
    torch.testing.assert_close(mixed[0], alone[0], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------- K09
class _FixedLogits(torch.nn.Module):
    """Stub causal LM whose logits are [2, 1, 0] at every position (the K09 case)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(use_cache=False)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        logits = torch.tensor([2.0, 1.0, 0.0]).expand(*input_ids.shape, 3) + 0 * self.anchor
        return SimpleNamespace(logits=logits)


def test_k09_case_numbers_on_the_engine():
    engine = _engine(model=_FixedLogits())
    data = _batch([([1, 2], [0])], 2, 1)
    data.meta_info["temperature"] = 0.5
    got = float(engine.compute_log_prob(data).batch["old_log_probs"][0, 0])
    # log_softmax([4, 2, 0])[0] = -log(1 + e^-2 + e^-4)
    assert got == pytest.approx(-math.log(1 + math.exp(-2) + math.exp(-4)), abs=1e-6)
    assert got == pytest.approx(-0.142932, abs=1e-6)
    assert math.exp(got - -0.142932) == pytest.approx(1.0, abs=1e-5)  # first-step ratio 1, not 0.767456


def test_k09_one_position_equals_independent_tempered_log_softmax():
    model = make_gpt2()
    engine = _engine(model=model)
    prompt, token = [10, 11, 12, 13], 57
    data = _batch([(prompt, [token]), (TEXT_B[0], [40])], 8, 1)  # left-padded next to a longer row
    data.meta_info["temperature"] = 0.5
    got = float(engine.compute_log_prob(data).batch["old_log_probs"][0, 0])
    with torch.no_grad():
        z = model(input_ids=torch.tensor([prompt])).logits[0, -1].double().numpy()
    z_t = z / 0.5
    expected = z_t[token] - np.log(np.exp(z_t - z_t.max()).sum()) - z_t.max()
    untempered = z[token] - np.log(np.exp(z - z.max()).sum()) - z.max()
    assert got == pytest.approx(expected, abs=1e-5)
    assert abs(expected - untempered) > 1e-2  # the check can tell T=0.5 from the known-wrong T=1


def _rollout(model, config: SimpleNamespace, prompts: list[list[int]]) -> DataProto:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    engine = HFRolloutEngine(model, make_tiny_tokenizer(), config)
    return engine.generate(DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask}))


PROMPTS = [[10, 11, 12, 13, 14], [30, 31], [50, 51, 52, 53, 54, 55, 56, 57], [70, 71, 72]]


def _rollout_cfg(**kw) -> SimpleNamespace:
    base = dict(response_length=6, calculate_log_probs=True, temperature=0.7, top_p=1.0, top_k=-1, seed=3)
    return SimpleNamespace(**{**base, **kw})


def test_k09_rollout_log_probs_equal_recomputed_at_the_rollout_temperature():
    # Rollout and trainer hold identical weights (two copies built from one seed, as after a weight sync).
    out = _rollout(make_gpt2(), _rollout_cfg(do_sample=True, temperature=0.7), PROMPTS)
    mask = out.batch["response_mask"].bool()
    assert int(mask.sum()) > len(PROMPTS)  # several tokens were sampled
    out.meta_info["temperature"] = 0.7
    recomputed = _engine(model=make_gpt2()).compute_log_prob(out).batch["old_log_probs"]
    rollout = out.batch["rollout_log_probs"]
    torch.testing.assert_close(recomputed[mask], rollout[mask], atol=1e-5, rtol=0)
    ratio = torch.exp(recomputed[mask] - rollout[mask])  # the first PPO ratio
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    # Known wrong: recomputing without the temperature gives a ratio far from 1.
    out.meta_info["temperature"] = 1.0
    untempered = _engine(model=make_gpt2()).compute_log_prob(out).batch["old_log_probs"]
    assert float((untempered[mask] - rollout[mask]).abs().max()) > 1e-2


def test_k09_greedy_rollout_log_probs_equal_recomputed_at_temperature_one():
    # Greedy decoding reports untempered log-probs (T = 1) whatever rollout.temperature says.
    out = _rollout(make_gpt2(), _rollout_cfg(do_sample=False, temperature=0.7), PROMPTS)
    mask = out.batch["response_mask"].bool()
    out.meta_info["temperature"] = 1.0
    recomputed = _engine(model=make_gpt2()).compute_log_prob(out).batch["old_log_probs"]
    torch.testing.assert_close(recomputed[mask], out.batch["rollout_log_probs"][mask], atol=1e-5, rtol=0)
