"""FSDP -> SGLang weight sync on one CUDA GPU, through core's colocated checkpoint engine in the hybrid cycle
(``scripts/check_cuda.sh``).

The FSDP actor holds other weights than the folder the SGLang engine started from (a perturbed copy); after
``sleep`` / ``wake_up(["weights"])`` / sync / ``wake_up(["kv_cache"])`` the SGLang log-probs must match the
float32 reference engine holding the actor's weights, and greedy text must have changed. Also a second sync
with nothing released (the plain path). Skipped where there is no CUDA GPU or no SGLang kernel package.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.distributed as dist

from verl.testing.conformance import make_prompt_batch, perturb_weights, save_conformance_model
from verl.testing.conformance.build import build_rollout_engine, load_kit_config, plugin_spec
from verl.testing.conformance.checks import check_log_probs_close
from verl.testing.conformance.rollout import rollout_overrides


def _why_not() -> str | None:
    from verl_sglang.backend import sglang_available

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    usable = sglang_available()
    return None if usable is True else usable


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


@pytest.fixture(scope="module", autouse=True)
def world_of_one():
    from verl.engines.weight_sync import free_port

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def _perturbed_copy(model_path, target):
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_path, target)
    stored = load_file(str(model_path / "model.safetensors"))
    perturbed = perturb_weights(stored.items(), scale=0.5, seed=1)
    save_file(
        {n: t.contiguous() for n, t in perturbed.items()}, str(target / "model.safetensors"), metadata={"format": "pt"}
    )
    return target


def _log_probs(oracle, out, temperature):
    from verl.protocol import DataProto

    keys = ("input_ids", "attention_mask", "position_ids", "responses")
    data = DataProto.from_dict(tensors={k: out.batch[k].cpu() for k in keys}, meta_info={"temperature": temperature})
    return oracle.compute_log_prob(data).batch["old_log_probs"]


def test_fsdp_weights_reach_sglang_through_the_hybrid_cycle(tmp_path):
    from verl.config import role_options
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine
    from verl.models import load_tokenizer

    model = save_conformance_model(tmp_path / "model", hidden_size=256)
    trained = _perturbed_copy(model, tmp_path / "trained")
    cfg = load_kit_config(
        [
            *rollout_overrides(model, "sglang"),
            "trainer.device=cuda",
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        ]
    )
    device = torch.device("cuda", torch.cuda.current_device())
    fsdp = plugin_spec("training_engine", "fsdp")
    actor = fsdp.factory(
        cfg, role="actor", model=trained, options=role_options(cfg, "actor", fsdp), device=device, world_size=1
    )
    tokenizer = load_tokenizer(model)
    rollout = build_rollout_engine(
        plugin_spec("rollout_engine", "sglang"), cfg, model=model, tokenizer=tokenizer, device=device
    )
    try:
        prompts = make_prompt_batch(tokenizer, ["Hello there", "What is two plus two?", "Tell me"], n=2)
        greedy = {"validate": True}
        before = rollout.generate(
            make_prompt_batch(tokenizer, ["Hello there", "What is two plus two?", "Tell me"], meta_info=greedy)
        )
        sync = ColocatedCheckpointEngine(cfg.actor_rollout_ref.rollout.checkpoint_engine)
        rollout.sleep()
        rollout.wake_up(["weights"])
        metrics = sync.sync(actor, rollout)
        rollout.wake_up(["kv_cache"])
        assert metrics["tensors"] > 0 and not metrics["shared"]
        after = rollout.generate(
            make_prompt_batch(tokenizer, ["Hello there", "What is two plus two?", "Tell me"], meta_info=greedy)
        )
        assert not torch.equal(after.batch["responses"].cpu(), before.batch["responses"].cpu())
        oracle = ReferenceTrainingEngine(trained, EngineSettings(dtype="float32"), device="cpu")
        temperature = float(cfg.actor_rollout_ref.rollout.temperature)
        sampled = rollout.generate(prompts)
        check_log_probs_close(
            sampled.batch["rollout_log_probs"],
            _log_probs(oracle, sampled, temperature),
            sampled.batch["response_mask"],
            atol=5e-2,
            what="sglang after the FSDP sync vs the reference engine with the actor's weights",
        )
        sync.sync(actor, rollout)  # awake: the plain path, same weights again
        again = rollout.generate(
            make_prompt_batch(tokenizer, ["Hello there", "What is two plus two?", "Tell me"], meta_info=greedy)
        )
        assert torch.equal(again.batch["responses"].cpu(), after.batch["responses"].cpu())
    finally:
        rollout.close()
