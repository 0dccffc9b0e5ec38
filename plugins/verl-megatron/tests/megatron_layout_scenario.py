"""Two gloo ranks, megatron TP=2: ``iter_weights(layout)`` into a TP=2 rollout layout (each rank's slices, no
communication) and into a TP=1 layout (whole tensors), compared with the HF model's weights; results per rank
saved as ``rank{r}.pt`` under argv[1] (run by ``test_megatron_layout_sync.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(out: Path, model_path: str) -> None:
    from megatron.core import parallel_state as ps
    from transformers import AutoModelForCausalLM

    from verl.config import load_config, role_options
    from verl.engines.weight_sync.layout import TensorParallelLayout, model_module_styles
    from verl.engines.weight_sync.reshard import ReshardStats
    from verl.plugins import get_plugin_manager

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_path}",
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=1",
        ]
    )
    spec = get_plugin_manager().get("training_engine", "megatron")
    engine = spec.factory(cfg, role="actor", model=model_path, options=role_options(cfg, "actor", spec), world_size=2)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    full = hf.state_dict()
    results = {}
    for tp in (2, 1):
        layout = TensorParallelLayout(2, tp, model_module_styles(hf.config))
        stats = ReshardStats()
        worst, mismatched = 0.0, []
        names = []
        for name, got in engine.iter_weights(layout, stats=stats):
            names.append(name)
            piece = layout.slice_for(name, tuple(full[name].shape), rank)
            want = full[name] if piece is None else full[name].narrow(piece.dim, piece.start, piece.length)
            if tuple(got.shape) != tuple(want.shape):
                mismatched.append((name, tuple(got.shape), tuple(want.shape)))
                continue
            worst = max(worst, float((got - want).abs().max()))
        manifest = engine.weight_manifest(layout)
        results[tp] = {
            "worst": worst,
            "mismatched": mismatched,
            "names": names,
            "manifest_ok": [(n, tuple(s)) for n, s in manifest]
            == [
                (
                    n,
                    tuple(full[n].shape)
                    if layout.slice_for(n, tuple(full[n].shape), rank) is None
                    else layout.slice_for(n, tuple(full[n].shape), rank).shape_of(tuple(full[n].shape)),
                )
                for n in names
            ],
            "stats": stats.as_metrics(),
        }
    results["hf_names"] = list(full)
    torch.save(results, out / f"rank{rank}.pt")
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
