"""Two-rank FSDP2 runs with verl's log-prob/entropy switches (``python fused_scenarios.py OUT_DIR``).

Each rank takes its half of ``fsdp_scenarios.make_batch()``, computes log-probs and entropy and trains 3 steps
with an entropy-bonus loss under ``use_fused_kernels`` (padded and packed rows; micro-batches of one row, so a
rank also runs a micro-batch without response tokens) and under chunked + checkpointed entropy, then writes
``OUT_DIR/rank<R>.pt``. ``test_fsdp_fused.py`` compares them with the plain single-process reference engine.
Not collected by pytest (no ``test_`` prefix).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from verl.algorithms import agg_loss
from verl.testing.distributed import load_script
from verl.testing.tiny import make_tiny_model

S = load_script(Path(__file__).with_name("fsdp_scenarios.py"), "fsdp_scenarios")

SWITCHES = {
    "fused": {"use_fused_kernels": True, "micro_batch_size": 1},
    "fused_packed": {"use_fused_kernels": True, "use_remove_padding": True},
    "chunked_ckpt": {
        "entropy_from_logits_with_chunking": True,
        "entropy_from_logits_chunk_size": 3,
        "entropy_checkpointing": True,
    },
}


def entropy_bonus_loss(micro, outputs, norm):
    """token-mean of -A * log p - 0.05 * entropy, with the global normalisers."""
    mask = micro.batch["response_mask"]
    per_token = -micro.batch["advantages"] * outputs["log_probs"] - 0.05 * outputs["entropys"]
    loss = agg_loss(per_token, mask, "token-mean", **norm)
    return loss, {"test/loss": float(loss.detach()) / norm["dp_size"]}


def run(out: Path) -> None:
    import torch.distributed as dist
    from verl_fsdp.dist import ensure_process_group
    from verl_fsdp.engine import FSDPTrainingEngine

    ensure_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    half = S.ROWS // world
    local = S.make_batch()[rank * half : (rank + 1) * half]
    res: dict = {}
    for name, kw in SWITCHES.items():
        eng = FSDPTrainingEngine(
            make_tiny_model(seed=S.MODEL_SEED), S.settings(**kw), optim=S.optim(), total_training_steps=10
        )
        res[f"{name}_logp"] = eng.compute_log_prob(local, calculate_entropy=True).batch.to_dict()
        res[f"{name}_metrics"] = S.train(eng, local, entropy_bonus_loss)
        res[f"{name}_weights"] = S.weights(eng)
    torch.save(res, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
    os._exit(0)
