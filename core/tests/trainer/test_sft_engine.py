"""The SFT trainer's engine comes from the RL actor's path (:mod:`verl.trainer.sft_engine`): the SFT keys become the
actor's keys of an RL run config, checked by the real plugins (not the config tests' fakes), errors under SFT keys."""

from __future__ import annotations

import pytest

from verl.config.errors import ConfigError
from verl.config.sft_loader import load_sft_config


def test_engine_keys_are_checked_as_the_rl_actors_under_their_sft_names():
    """The engine, its flat options and the LoRA keys go through the RL actor's checks; errors name SFT keys."""
    base = ["data.train_files=t.parquet"]
    cfg = load_sft_config(None, [*base, "engine.param_offload=true", "engine.model_dtype=bf16", "model.lora_rank=8"])
    assert cfg.engine.options == {"param_offload": True} and cfg.engine.model_dtype == "bf16"
    from verl.trainer.sft_engine import actor_run_config

    run = actor_run_config(cfg)
    actor = run.actor_rollout_ref.actor
    assert actor.engine_kwargs["reference"] == {"param_offload": True, "dtype": "bfloat16"}
    assert (actor.ppo_mini_batch_size, run.actor_rollout_ref.rollout.n, actor.ppo_epochs) == (256, 1, 1)
    assert (actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz, actor.ppo_max_token_len_per_gpu) == (
        4,
        True,
        8192,
    )
    assert actor.optim.lr == cfg.optim.lr == 1e-3
    assert run.actor_rollout_ref.model.lora_rank == 8 and run.actor_rollout_ref.model.target_modules == "all-linear"
    cases = {
        # an FSDP-only option on the one-process engine
        ("engine.fsdp_size=2",): ("engine.fsdp_size", "is not FSDP; of engine it honours param_offload"),
        ("engine=nosuch",): ("engine.strategy", "unknown training engine 'nosuch'; available: reference"),
        ("model.lora_rank=-1",): ("model.lora_rank", "must be >= 0"),
        ("model.lora_adapter_path=/a",): ("model.lora_adapter_path", "set model.lora_rank > 0"),
        ("engine.options={a: 1}",): ("engine.options", "write the engine's keys flat"),
    }
    for extra, (key, text) in cases.items():
        with pytest.raises(ConfigError) as info:
            load_sft_config(None, [*base, *extra])
        assert [i.key for i in info.value.issues] == [key], extra
        assert text in str(info.value) and "actor_rollout_ref" not in str(info.value), str(info.value)


def test_torchrun_world_follows_torchrun_and_checks_the_trainer_keys():
    from verl.trainer.sft_ranks import SFTWorld, torchrun_world

    assert torchrun_world(1, 1, environ={}) == SFTWorld(0, 1, 0)
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    # verl's torchrun launch leaves n_gpus_per_node at 1 whatever --nproc_per_node is: torchrun's world counts.
    assert torchrun_world(1, 1, environ=env) == SFTWorld(3, 4, 1)
    assert torchrun_world(2, 2, environ=env) == SFTWorld(3, 4, 1)
    with pytest.raises(ConfigError, match="n_gpus_per_node=4 but torchrun started 2 processes"):
        torchrun_world(1, 4, environ=env)
    with pytest.raises(ConfigError, match="nnodes x trainer.n_gpus_per_node = 6 but torchrun's world has 4"):
        torchrun_world(3, 2, environ=env)
    with pytest.raises(ConfigError, match="not started by torchrun"):
        torchrun_world(1, 2, environ={})


def test_the_one_process_engine_refuses_several_ranks_and_batches_must_split_evenly():
    from verl.trainer.sft_engine import build_sft_engine, check_world

    cfg = load_sft_config(None, ["data.train_files=t.parquet", "data.train_batch_size=6"])
    with pytest.raises(ConfigError, match="engine.strategy=reference trains in one process, but torchrun started 2"):
        build_sft_engine(cfg, model_path="unused", total_training_steps=1, device="cpu", world_size=2)
    check_world(cfg, 3)
    with pytest.raises(ConfigError, match="data.train_batch_size=6 must be a multiple of the 4 data-parallel"):
        check_world(cfg, 4)
    fixed = ["data.train_files=t.parquet", "data.train_batch_size=6", "data.use_dynamic_bsz=false"]
    with pytest.raises(ConfigError, match=r"data.train_batch_size \(6\) x samples per row \(1\) / world size"):
        load_sft_config(None, fixed)  # the RL actor's rule, under the SFT keys
    with pytest.raises(ConfigError, match="micro_batch_size_per_gpu=2 must divide the 3 rows per data-parallel"):
        check_world(load_sft_config(None, [*fixed, "data.micro_batch_size_per_gpu=2"]), 2)


def test_lora_sft_trains_only_the_adapter_and_writes_a_merged_model(tmp_path):
    """LoRA SFT on the reference engine: B starts at 0, so step 1's loss is full fine-tuning's; the checkpoint
    holds only adapter tensors; final_hf is base + (alpha / r) B @ A on the adapted weights only."""
    import json
    import random

    import torch
    from safetensors.torch import load_file

    from verl.engines.reference.checkpoint_files import load_engine_state
    from verl.testing.tiny import save_tiny_model
    from verl.trainer.sft_trainer import SFTTrainer

    rng = random.Random(0)
    rows = []
    for _ in range(8):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        rows.append(
            {"messages": [{"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)}]}
        )
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = save_tiny_model(tmp_path / "model")

    def run(name, *extra):
        keys = [
            f"data.train_files={tmp_path / 'train.jsonl'}",
            f"model.path={model}",
            "data.train_batch_size=4",
            "data.max_length=64",
            "trainer.total_training_steps=2",
            "trainer.logger=[file]",
            "optim.lr=1e-2",
            f"trainer.default_local_dir={tmp_path / name}",
            *extra,
        ]
        trainer = SFTTrainer(load_sft_config(None, keys))
        trainer.fit()
        return trainer, [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]

    _, full = run("full")
    trainer, lora = run("lora", "model.lora_rank=4", "model.lora_alpha=8", "model.target_modules=[q_proj,v_proj]")
    assert lora[0]["train/loss"] == pytest.approx(full[0]["train/loss"], rel=1e-6)
    assert lora[1]["train/loss"] != pytest.approx(full[1]["train/loss"], rel=1e-3)  # different updates
    actor = tmp_path / "lora" / "global_step_2" / "actor"
    state = load_engine_state(actor, 1, 0)
    assert state["model"] and all(".lora_A." in k or ".lora_B." in k for k in state["model"]), list(state["model"])
    info = json.loads((actor / "checkpoint.json").read_text())
    assert info["strategy"] == "reference" and info["lora"]["base_model"] == str(model)
    base = load_file(str(model / "model.safetensors"))
    merged = load_file(str(tmp_path / "lora" / "final_hf" / "model.safetensors"))
    changed = sorted(n for n, t in merged.items() if not torch.equal(t, base[n]))
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed), changed
    # The merged weight is exactly base + (alpha / r) * B @ A of the trained adapter.
    peft = trainer.engine.model.state_dict()
    name = changed[0]
    prefix = name[: -len(".weight")]
    a, b = peft[f"{prefix}.lora_A.default.weight"], peft[f"{prefix}.lora_B.default.weight"]
    torch.testing.assert_close(merged[name], base[name] + (8 / 4) * b @ a, rtol=0, atol=1e-6)
    assert (tmp_path / "lora" / "final_hf" / "lora_adapter" / "adapter_config.json").exists()
    # `verl export` of the LoRA checkpoint: the merged model (= final_hf) or the adapter alone.
    from verl.cli.main import main as verl_main

    assert verl_main(["export", str(actor.parent), str(tmp_path / "merged")]) == 0
    exported = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert all(torch.allclose(exported[n], t, atol=1e-6, rtol=0) for n, t in merged.items())
    assert verl_main(["export", str(actor.parent), str(tmp_path / "adapter"), "--adapter"]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
