"""``verl sft`` on the FSDP engine over 2 gloo ranks (issue #21): the same numbers as the one-process reference
engine (the oracle: core's engine on the whole batch), full fine-tuning and LoRA, exact resume of a sharded
run, and the output folder loading as an RL actor.

The multi-rank runs are real launches: ``verl sft ... trainer.n_gpus_per_node=2`` starts torchrun itself, and the
resume scenario (``sft_scenarios.py``) runs under the same torchrun-style environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import verl.testing.sft as SC
from verl.testing.distributed import run_ranks

HERE = Path(__file__).parent
FSDP = ("engine=fsdp", "trainer.n_gpus_per_node=2")
LORA = ("model.lora_rank=4", "model.lora_alpha=8")
COMPARED = ("train/loss", "train/grad_norm", "train/lr", "train/global_tokens", "train/epoch", "val/loss")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return SC.make_assets(tmp_path_factory.mktemp("fsdp_sft"))


def _reference(assets, run: Path, *extra: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    return SC.reference_run(*assets, run, *extra)


def _verl_sft(assets, run: Path, *extra: str):
    return SC.launch(*assets, run, *FSDP, *extra)


_rows, _weights = SC.metrics, SC.hf_weights


def _assert_same_rows(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, SC.STEPS + 1))
    for a, b in zip(got, want, strict=True):
        assert sorted(k for k in a if k in COMPARED) == sorted(k for k in b if k in COMPARED), a["step"]
        for key in COMPARED:
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)


def _assert_close_weights(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=2e-5, msg=name)


@pytest.mark.multiprocess
def test_fsdp_sft_over_two_ranks_equals_the_reference_engine(assets, tmp_path):
    want_rows, want_weights = _reference(assets, tmp_path / "ref")
    proc = _verl_sft(assets, tmp_path / "fsdp")
    assert "verl sft: starting 2 ranks" in proc.stderr
    assert proc.stdout.count("verl sft: done (5 steps)") == 1  # rank 0 reports, once
    rows = _rows(tmp_path / "fsdp")
    _assert_same_rows(rows, want_rows)
    assert [("val/loss" in r) for r in rows] == [False, True, False, True, True]
    _assert_close_weights(_weights(tmp_path / "fsdp" / "final_hf"), want_weights)
    # The checkpoints are FSDP's own (DCP shards of both ranks), written into the manager's folders.
    ckpt = tmp_path / "fsdp" / "global_step_4" / "actor"
    assert ckpt.is_dir() and any(ckpt.rglob("*.distcp"))
    assert (tmp_path / "fsdp" / "latest_checkpointed_iteration.txt").read_text() == "5"

    # `verl export` merges the last DCP checkpoint into the final weights; the one-process engine refuses to resume it.
    from verl.cli.main import main as verl_main
    from verl.trainer.checkpoint import CheckpointResumeError

    assert verl_main(["export", str(tmp_path / "fsdp" / "global_step_5"), str(tmp_path / "exported")]) == 0
    for name, tensor in _weights(tmp_path / "fsdp" / "final_hf").items():
        assert torch.equal(_weights(tmp_path / "exported")[name], tensor), name
    with pytest.raises(CheckpointResumeError, match=r"engine.strategy=fsdp over 2 process\(es\), this run is"):
        _reference(assets, tmp_path / "fsdp", "trainer.total_training_steps=6")

    # A sharded run stopped after its step-2 checkpoint and resumed goes on exactly as the uninterrupted one.
    root, model = assets
    resumed = tmp_path / "resumed"
    args = [str(root), str(model), str(resumed), "engine=fsdp"]
    run_ranks(HERE / "sft_scenarios.py", args, world_size=2, timeout_s=400)
    strip = [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in _rows(resumed)]
    assert strip == [{k: v for k, v in r.items() if not k.startswith("timing_s/")} for r in rows]
    for name, tensor in _weights(tmp_path / "fsdp" / "final_hf").items():
        assert torch.equal(_weights(resumed / "final_hf")[name], tensor), name


@pytest.mark.multiprocess
def test_lora_sft_on_fsdp_equals_the_reference_and_trains_only_the_adapter(assets, tmp_path):
    want_rows, want_weights = _reference(assets, tmp_path / "ref", *LORA)
    full_rows = _rows(tmp_path / "ref_full") if (tmp_path / "ref_full").exists() else None
    _verl_sft(assets, tmp_path / "fsdp", *LORA)
    rows = _rows(tmp_path / "fsdp")
    _assert_same_rows(rows, want_rows)
    _assert_close_weights(_weights(tmp_path / "fsdp" / "final_hf"), want_weights)
    # final_hf is the merged model; the adapter beside it is a peft folder of the configured rank and alpha.
    adapter = json.loads((tmp_path / "fsdp" / "final_hf" / "lora_adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (4, 8)
    # B starts at 0: step 1's loss is the base model's, as full fine-tuning's step 1.
    if full_rows is None:
        full_rows, _ = _reference(assets, tmp_path / "ref_full")
    assert rows[0]["train/loss"] == pytest.approx(full_rows[0]["train/loss"], rel=1e-6)
    # Only the adapter trained: the merged weights differ from the base where LoRA is, and only there.
    _, model = assets
    base = _weights(Path(model))
    merged = _weights(tmp_path / "fsdp" / "final_hf")
    changed = {n for n, t in merged.items() if not torch.equal(t, base[n])}
    assert changed and all(n.endswith("_proj.weight") for n in changed), sorted(changed)
    assert not any("embed" in n or "norm" in n for n in changed)
