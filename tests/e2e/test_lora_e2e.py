"""`verl train` with LoRA (issue #21) on a tiny model: the KL reference is the base model (adapters disabled),
the checkpoint holds only the adapter, a resumed run reproduces the next step, and the final actor and
`verl export` give the merged model or the peft adapter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from verl.cli.main import main as verl_main
from verl.engines.reference.checkpoint_files import load_engine_state
from verl.testing.workspace import make_gsm8k_workspace, run_metrics

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("lora"), train=8, test=2)


def _args(ws: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        "data.max_prompt_length=320",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        f"actor_rollout_ref.model.path={ws['model']}",
        *LORA,
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=0.05",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        "reward_model.num_workers=1",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=null",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *extra,
    ]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def lora_run(workspace) -> Path:
    run_dir = workspace["root"] / "run"
    assert verl_main(_args(workspace, run_dir)) == 0
    return run_dir


def test_reference_is_the_base_model_and_the_checkpoint_is_the_adapter(workspace, lora_run):
    rows = [r for r in _metrics(lora_run) if r["step"] > 0]
    # Step 1 trains from B = 0: the policy equals the base model, so KL(policy || reference) is exactly 0.
    assert rows[0]["actor/kl_loss"] == 0.0
    assert rows[1]["actor/kl_loss"] > 0.0
    actor = lora_run / "ckpt" / "global_step_2" / "actor"
    state = load_engine_state(actor, 1, 0)
    assert state["lora"] and state["model"] and all(".lora_A." in k or ".lora_B." in k for k in state["model"])
    info = json.loads((actor / "checkpoint.json").read_text())
    assert info["lora"] == {"adapter": "lora_adapter", "base_model": str(workspace["model"])}
    assert (actor / "lora_adapter" / "adapter_model.safetensors").is_file()


def test_resume_from_step_1_reproduces_step_2(workspace, lora_run):
    run_dir = workspace["root"] / "resumed"
    ckpt = run_dir / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(lora_run / "ckpt" / "global_step_1", ckpt / "global_step_1")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1")
    assert verl_main(_args(workspace, run_dir, "trainer.resume_mode=auto")) == 0
    (resumed,) = [r for r in _metrics(run_dir) if r["step"] > 0]
    expected = next(r for r in _metrics(lora_run) if r["step"] == 2)
    assert run_metrics(resumed) == run_metrics(expected)


def test_final_actor_and_verl_export_merged_or_adapter(workspace, lora_run, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    final = load_file(str(lora_run / "final_hf" / "model.safetensors"))
    assert final and not any("lora" in k for k in final)
    step2 = lora_run / "ckpt" / "global_step_2"
    assert verl_main(["export", str(step2), str(tmp_path / "merged")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    for name, tensor in final.items():
        assert torch.allclose(exported[name], tensor, atol=1e-6, rtol=0), name
    assert (tmp_path / "merged" / "tokenizer_config.json").is_file()
    assert verl_main(["export", str(step2), str(tmp_path / "adapter"), "--adapter"]) == 0
    base = AutoModelForCausalLM.from_pretrained(workspace["model"])
    moved = PeftModel.from_pretrained(base, tmp_path / "adapter").merge_and_unload().state_dict()
    start = AutoModelForCausalLM.from_pretrained(workspace["model"]).state_dict()  # `base` was merged in place
    assert any(not torch.equal(moved[k], v) for k, v in start.items())  # the adapter trained
    for name, tensor in final.items():
        assert torch.allclose(moved[name], tensor, atol=1e-6, rtol=0), name


def test_export_adapter_of_a_full_checkpoint_is_refused(tmp_path, capsys):
    actor = tmp_path / "actor"
    actor.mkdir()
    (actor / "checkpoint.json").write_text(json.dumps({"strategy": "reference", "world_size": 1}))
    assert verl_main(["export", str(tmp_path), str(tmp_path / "out"), "--adapter"]) == 2
    assert "holds no LoRA adapter" in capsys.readouterr().err
