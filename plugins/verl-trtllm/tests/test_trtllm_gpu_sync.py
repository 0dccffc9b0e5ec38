"""The hybrid engine's weight sync FSDP -> ``trtllm`` on one NVIDIA GPU (``scripts/check_cuda.sh`` runs it).

Skipped without TensorRT-LLM, a GPU or verl-fsdp. The FSDP actor is built from a perturbed copy of the model,
the ``trtllm`` rollout from the original; after core's ``colocated`` checkpoint engine syncs the actor into the
rollout, greedy responses equal those of core's ``hf`` engine loading the perturbed copy (the oracle), and
differ from the rollout's answers before the sync (the weights did arrive).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from verl.testing.conformance import CONFORMANCE_PROMPTS, make_prompt_batch, perturb_weights, save_conformance_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is None, reason="TensorRT-LLM is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("verl_fsdp") is None, reason="verl-fsdp is not installed"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("trtllm_sync")
    original = save_conformance_model(root / "original", hidden_size=128)
    perturbed = save_conformance_model(root / "perturbed", hidden_size=128)
    weights = load_file(str(perturbed / "model.safetensors"))
    changed = perturb_weights(weights.items(), scale=0.5, seed=3)
    save_file({k: v.contiguous() for k, v in changed.items() if k in weights}, str(perturbed / "model.safetensors"))
    return original, perturbed


@pytest.fixture(scope="module")
def world():
    import torch.distributed as dist

    from verl.engines.weight_sync.group import free_port

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1)
    yield


def _config(model_path):
    from verl.config import load_config

    return load_config(
        None,
        [
            f"actor_rollout_ref.model.path={model_path}",
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.rollout.name=trtllm",
            "trainer.device=cuda",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
            "data.max_prompt_length=32",
            "data.max_response_length=16",
        ],
    )


def test_fsdp_to_trtllm_sync_reaches_the_rollout(folders, world):
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.models import load_tokenizer
    from verl.testing.conformance.build import (
        build_checkpoint_engine,
        build_rollout_engine,
        build_training_engine,
        plugin_spec,
    )

    original, perturbed = folders
    cfg = _config(original)
    tokenizer = load_tokenizer(original)
    prompts = make_prompt_batch(tokenizer, CONFORMANCE_PROMPTS, n=1, meta_info={"validate": True})
    rollout = build_rollout_engine(
        plugin_spec("rollout_engine", "trtllm"), cfg, model=original, tokenizer=tokenizer, device="cuda"
    )
    try:
        before = rollout.generate(prompts).batch["responses"].cpu()
        actor = build_training_engine(plugin_spec("training_engine", "fsdp"), cfg, model=perturbed, device="cuda")
        sync = build_checkpoint_engine(plugin_spec("checkpoint_engine", "colocated"), cfg)
        metrics = sync.sync(actor, rollout)
        assert metrics["tensors"] > 0
        after = rollout.generate(prompts).batch["responses"].cpu()
    finally:
        rollout.close()
    oracle = HFRolloutEngine(perturbed, tokenizer, cfg.actor_rollout_ref.rollout, device="cuda")
    expected = oracle.generate(prompts).batch["responses"].cpu()
    assert not torch.equal(before, after), "the sync changed no greedy response: the weights did not arrive"
    same = (after == expected).all(dim=1)
    assert bool(same.all()), (
        f"greedy responses differ from the hf engine with the synced weights in rows {(~same).nonzero().flatten().tolist()}"
    )
