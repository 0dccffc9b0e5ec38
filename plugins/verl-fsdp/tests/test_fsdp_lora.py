"""LoRA in the FSDP engine over 2 gloo ranks (issue #21), against the single-process reference engine: base
log-probs before the first update, only adapters train, merged sync, adapter-only DCP resume, HF export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl.engines.lora import AdapterDisabledReference
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.testing.distributed import load_script, run_ranks
from verl.testing.tiny import make_tiny_model

HERE = Path(__file__).parent
ATOL = 1e-5


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, scenarios):
    sc = load_script(HERE / "lora_scenarios.py", "lora_scenarios")
    out = tmp_path_factory.mktemp("fsdp_lora")
    run_ranks(HERE / "lora_scenarios.py", [str(out)], world_size=2, timeout_s=240)
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    # The oracle: one process, the whole batch, the same seed for peft's A.
    torch.manual_seed(sc.A_SEED)
    settings = EngineSettings(mini_batch_size=scenarios.ROWS, micro_batch_size=2, clip_grad=1.0, lora=sc.LORA)
    ref = ReferenceTrainingEngine(
        make_tiny_model(seed=scenarios.MODEL_SEED), settings, optim=scenarios.optim(), total_training_steps=10
    )
    data = scenarios.make_batch()
    base = AdapterDisabledReference(ref).compute_log_prob(data).batch["old_log_probs"]
    metrics = [ref.train_batch(data, scenarios.token_mean_loss) for _ in range(2)]
    oracle = {
        "base": base,
        "metrics": metrics,
        "merged": {n: t.clone() for n, t in ref.iter_weights()},
        "adapter": {n: p.detach().clone() for n, p in ref.model.named_parameters() if p.requires_grad},
        "logp2": ref.compute_log_prob(data).batch["old_log_probs"],
    }
    return out, ranks, oracle


def test_base_log_probs_before_the_first_update_and_reference_by_disabled_adapters(lora_runs):
    _, ranks, oracle = lora_runs
    for r in ranks:
        assert torch.equal(r["logp0"], r["ref0"])  # B = 0: the adapted forward is bitwise the base one
        assert torch.equal(r["ref2"], r["ref0"])  # after updates the disabled-adapter reference is still the base
    assert torch.allclose(torch.cat([r["logp0"] for r in ranks]), oracle["base"], atol=ATOL, rtol=0)
    assert torch.allclose(torch.cat([r["logp2"] for r in ranks]), oracle["logp2"], atol=ATOL, rtol=0)


def test_only_adapters_train_and_match_the_reference(lora_runs):
    _, ranks, oracle = lora_runs
    numel = sum(t.numel() for t in oracle["adapter"].values())
    for r in ranks:
        assert r["frozen_unchanged"]
        assert sorted(r["adapter"]) == sorted(oracle["adapter"])
        # The optimizer holds exactly the adapter parameters, each rank its shard of them.
        assert r["optimizer_numel"] == numel
        assert 0 < r["optimizer_local_numel"] < numel
        for name, want in oracle["adapter"].items():
            assert torch.allclose(r["adapter"][name], want, atol=ATOL, rtol=0), name
        got = [m["actor/grad_norm"][0] for m in (r["metrics1"], r["metrics2"])]
        want = [m["actor/grad_norm"][0] for m in oracle["metrics"]]
        assert got == pytest.approx(want, rel=1e-4)


def test_merged_sync_has_base_names_and_matches_the_reference_merge(lora_runs):
    _, ranks, oracle = lora_runs
    for r in ranks:
        # 2-D weights stay shards: the 14 merged (2 layers x 7 linears), the embedding and the tied LM head.
        assert r["merged_as_shards"] == 14 + 2
        assert list(r["merged"]) == list(oracle["merged"])
        assert r["manifest"] == [(n, tuple(t.shape)) for n, t in r["merged"].items()]
        for name, want in oracle["merged"].items():
            assert torch.allclose(r["merged"][name], want, atol=ATOL, rtol=0), name


def test_hybrid_sync_reshards_the_merged_weights_into_a_tp_rollout(lora_runs):
    _, ranks, _ = lora_runs
    for r in ranks:
        got = r["rollout_tp2"]
        for name, want in r["merged"].items():
            assert torch.equal(got[name], want), name


def test_adapter_only_dcp_checkpoint_resumes_exactly(lora_runs):
    import torch.distributed.checkpoint as dcp

    out, ranks, _ = lora_runs
    keys = dcp.FileSystemReader(str(out / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    for r in ranks:
        assert r["resumed_metrics2"] == r["metrics2"]
        assert all(torch.equal(r["resumed_adapter"][k], v) for k, v in r["adapter"].items())


def test_save_hf_is_the_merged_model_plus_a_peft_adapter(lora_runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, ranks, _ = lora_runs
    merged = AutoModelForCausalLM.from_pretrained(str(out / "hf"))
    for name, tensor in merged.state_dict().items():
        assert torch.equal(tensor, ranks[0]["merged"][name]), name
    base = make_tiny_model(seed=1)
    peft_merged = PeftModel.from_pretrained(base, str(out / "hf" / "lora_adapter")).merge_and_unload()
    for name, tensor in peft_merged.state_dict().items():
        assert torch.allclose(tensor, ranks[0]["merged"][name], atol=1e-6, rtol=0), name
