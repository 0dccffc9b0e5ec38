"""LoRA GRPO with the vLLM rollout (`verl train`, real SmolLM2-135M): the adapter served by vLLM, and merged weights.

Both runs start from the same LoRA adapter (``model.lora_adapter_path``: r = 16, alpha = 32, ``all-linear``, its B
seeded noise so that the adapted policy is far from the base). With ``actor.reuse_on_policy_log_prob=false`` and
``rollout.calculate_log_probs=true`` the trainer compares the rollout's log-probs of the sampled tokens with its own
recomputed ones every step (``rollout_corr/kl``): they agree only if vLLM generated with the actor's current
weights, base + adapter, from step 1 on. Served as an adapter (``model.lora.merge=false``), each sync moves the
adapter alone (``weight_sync/bytes``); merged (``model.lora.merge=true``, or unset on a CPU) it moves the whole model. Marked ``slow``: the
``plugin(vllm)`` nox session runs it.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

RANK, ALPHA = 16, 32


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A peft adapter on SmolLM2 whose B is noise; also checks that it moves the policy (so a stale rollout shows)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from verl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ids = load_tokenizer(path)("Natalia sold clips to 48 of her friends in April.", return_tensors="pt").input_ids
    with torch.no_grad():
        base = torch.log_softmax(model(ids).logits, -1)
    peft_model = get_peft_model(
        model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear", lora_dropout=0.0, bias="none")
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 3e-2)
        adapted = torch.log_softmax(peft_model(ids).logits, -1)
    # Mean KL(adapted || base) per position: the adapter changes the distribution well beyond float noise.
    kl = float((adapted.exp() * (adapted - base)).sum(-1).mean())
    assert kl > 0.05, kl
    folder = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(str(folder))
    return folder


def _run(tmp_path, adapter, *extra):
    from verl.cli.main import main as verl_main

    run_dir = tmp_path / "run"
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.model.lora_rank={RANK}",
        f"actor_rollout_ref.model.lora_alpha={ALPHA}",
        f"actor_rollout_ref.model.lora_adapter_path={adapter}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.reuse_on_policy_log_prob=false",
        "trainer.total_training_steps=2",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        *extra,
    ]
    assert verl_main(args) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0 and "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "timing_s/gen"):
            assert math.isfinite(row[key]), key
        # vLLM sampled with the actor's weights (the adapter's from step 1 on): log-probs agree.
        assert abs(row["rollout_corr/kl"]) < 2e-3, (row["step"], row["rollout_corr/kl"])
        assert row["rollout_corr/log_ppl_abs_diff"] < 2e-3, row["rollout_corr/log_ppl_abs_diff"]
    return steps


def test_lora_grpo_with_the_adapter_served_by_vllm(tmp_path, adapter):
    steps = _run(tmp_path, adapter, "actor_rollout_ref.model.lora={merge: false}")  # unset on a CPU: merged
    # The sync after step 1 moved the adapter alone: 7 adapted linears x 30 layers x (A, B), fp32.
    assert steps[0]["weight_sync/adapter"] == 1.0
    assert steps[0]["weight_sync/tensors"] == 7 * 30 * 2
    assert steps[0]["weight_sync/bytes"] == 4_884_480 * 4


@pytest.mark.parametrize("merge", ["actor_rollout_ref.model.lora={merge: true}", None])
def test_lora_grpo_with_merged_weights(tmp_path, adapter, merge):
    """``lora.merge=true``, and unset on a CPU (where vLLM's LoRA layers would generate 2.9x slower)."""
    steps = _run(tmp_path, adapter, *([merge] if merge else []))
    assert "weight_sync/adapter" not in steps[0]
    assert steps[0]["weight_sync/bytes"] > 500e6  # the whole fp32 model (134.5M parameters)
