"""Two-rank FSDP LoRA scenarios run as a script by ``test_fsdp_lora.py`` (``python lora_scenarios.py OUT_DIR``).

Each rank takes its half of ``fsdp_scenarios.make_batch()``, trains a LoRA FSDP engine (peft's A drawn with
the same seed on every rank and in the test's single-process reference), checkpoints after step 1, and writes
``OUT_DIR/rank<R>.pt``. Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import fsdp_scenarios as fs  # noqa: E402  (the shared batch, loss and settings)

from verl.engines.lora import AdapterDisabledReference, LoraSettings  # noqa: E402
from verl.testing.tiny import make_tiny_model  # noqa: E402

LORA = LoraSettings(rank=4, alpha=32)
A_SEED = 0


def full_params(engine, trainable: bool) -> dict[str, torch.Tensor]:
    """Whole (gathered) parameters of ``engine`` that are (not) trainable; collective."""
    return {
        n: engine._full_tensor(p.detach()).cpu().clone()
        for n, p in engine.model.named_parameters()
        if p.requires_grad == trainable
    }


def tp_rollout_weights(trainer, out: Path) -> dict[str, torch.Tensor]:
    """Whole weights of a TP=2 hf rollout (built from the untrained base model) after one colocated sync."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine, ColocatedOptions
    from verl.testing.tiny import make_tiny_tokenizer

    model_dir = out / "base_model"
    if dist.get_rank() == 0:
        make_tiny_model(seed=fs.MODEL_SEED).save_pretrained(str(model_dir))
    dist.barrier()
    rollout = HFRolloutEngine(model_dir, make_tiny_tokenizer(), fs.rollout_config(2), device="cpu")
    section = SimpleNamespace(update_weights_bucket_megabytes=1)
    ColocatedCheckpointEngine(section, options=ColocatedOptions(bucket_bytes=4096)).sync(trainer, rollout)
    return {
        n: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
        for n, t in rollout.model.state_dict().items()
    }


def run(out: Path) -> None:
    import torch.distributed as dist
    from verl_fsdp.dist import ensure_process_group
    from verl_fsdp.engine import FSDPTrainingEngine

    ensure_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    half = fs.ROWS // world
    local = fs.make_batch()[rank * half : (rank + 1) * half]
    res: dict = {}

    def engine(seed: int = A_SEED):
        torch.manual_seed(seed)
        return FSDPTrainingEngine(
            make_tiny_model(seed=fs.MODEL_SEED),
            fs.settings(lora=LORA),
            optim=fs.optim(),
            total_training_steps=10,
        )

    eng = engine()
    ref = AdapterDisabledReference(eng)
    res["logp0"] = eng.compute_log_prob(local).batch["old_log_probs"]
    res["ref0"] = ref.compute_log_prob(local).batch["old_log_probs"]
    frozen0 = full_params(eng, trainable=False)
    opt_params = [p for g in eng.optimizer.param_groups for p in g["params"]]
    res["optimizer_numel"] = sum(p.numel() for p in opt_params)  # global (DTensor) sizes
    res["optimizer_local_numel"] = sum(p.to_local().numel() for p in opt_params)
    res["metrics1"] = eng.train_batch(local, fs.token_mean_loss)
    eng.save_checkpoint(out / "dcp")
    res["metrics2"] = eng.train_batch(local, fs.token_mean_loss)
    res["frozen_unchanged"] = all(torch.equal(v, frozen0[k]) for k, v in full_params(eng, False).items())
    res["adapter"] = full_params(eng, trainable=True)
    eng.bucket_bytes = 4096  # several all-gather buckets
    res["merged"] = fs.weights(eng)
    # Adapted weights are merged shard by shard (W and B split alike along rows): no rank holds a whole W.
    from torch.distributed.tensor import DTensor

    res["merged_as_shards"] = sum(isinstance(t, DTensor) for _, t in eng._sync_items() if t.dim() == 2)
    res["manifest"] = eng.weight_manifest()
    res["logp2"] = eng.compute_log_prob(local).batch["old_log_probs"]
    res["ref2"] = ref.compute_log_prob(local).batch["old_log_probs"]
    eng.save_hf(out / "hf")
    # Hybrid sync into a tensor-parallel (TP=2) hf rollout loaded from the base model: the merged weights are
    # resharded into the rollout's layout (the reshard path, not the gather).
    res["rollout_tp2"] = tp_rollout_weights(eng, out)
    # Resume into an engine whose own fresh adapter differs: the checkpoint must replace it.
    again = engine(seed=A_SEED + 7)
    again.load_checkpoint(out / "dcp")
    res["resumed_metrics2"] = again.train_batch(local, fs.token_mean_loss)
    res["resumed_adapter"] = full_params(again, trainable=True)
    torch.save(res, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
