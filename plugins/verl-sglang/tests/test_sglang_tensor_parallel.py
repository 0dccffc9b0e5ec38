"""Tensor parallelism of the ``sglang`` engine in a 2-rank gloo world, on recording stand-ins
(``sglang_tp_scenarios.py``): one ``sglang.Engine`` per TP group, built and driven by the group's first rank; one
weight payload per TP rank; generations and failures reach every rank. The stand-in shows our calls and what
crosses the group, never that SGLang works (its TP engine is GPU only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl.testing.distributed import run_ranks

pytestmark = pytest.mark.multiprocess
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, model_path):
    out = tmp_path_factory.mktemp("sglang_tp")
    run_ranks(HERE / "sglang_tp_scenarios.py", [str(out), str(model_path)], world_size=2, timeout_s=240)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_standin_invisible_gpus_fail_on_every_rank(ranks):
    assert ranks[0]["not_visible"].startswith("RuntimeError") and "sees 0 GPU(s)" in ranks[0]["not_visible"]
    assert ranks[1]["not_visible"].startswith("SGLangEngineError") and "sees 0 GPU(s)" in ranks[1]["not_visible"]


def test_standin_tp_group_has_one_engine_on_its_first_rank(ranks):
    assert [r["has_engine"] for r in ranks] == [True, False]
    assert ranks[0]["server_args"]["tp_size"] == 2 and ranks[0]["server_args"]["base_gpu_id"] == 0
    assert [r["layout_tp"] for r in ranks] == [1, 1]  # every rank receives whole tensors


def test_standin_every_rank_gets_the_leaders_generation(ranks):
    assert torch.equal(ranks[0]["responses"], ranks[1]["responses"])
    assert torch.equal(ranks[0]["log_probs"], ranks[1]["log_probs"])
    assert ranks[0]["responses"].shape == (4, 16)


def test_standin_leader_sends_one_payload_per_tp_rank_in_order(ranks):
    calls = ranks[0]["calls"]
    assert calls[:2] == ["generate", "release_memory_occupation"]
    assert calls[2:4] == ["resume_memory_occupation", "begin_weight_update"]
    per_rank = ranks[0]["per_rank"]
    assert per_rank and len(per_rank) % 2 == 0
    for a, b in zip(per_rank[::2], per_rank[1::2], strict=True):
        assert a == b  # both ranks packed the same bucket


def test_standin_a_refused_load_fails_on_every_rank_and_ends_the_session(ranks):
    assert "boom" in ranks[0]["refused"]
    assert "failed on the TP group's first rank" in ranks[1]["refused"] and "boom" in ranks[1]["refused"]
    calls = ranks[0]["calls"]
    assert calls[-3:] == ["begin_weight_update", "update_weights_from_tensor", "end_weight_update"]
