"""Two-rank scenarios of the tensor-parallel rollout and the resharded weight sync (``python tp_scenarios.py OUT``).

Run by ``test_tensor_parallel.py`` through :func:`verl.testing.distributed.run_ranks` (gloo, CPU). Each rank
writes ``OUT/rank<R>.pt``; the tests compare with single-process oracles. Not collected by pytest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from verl.engines.reference.builders import HFRolloutOptions
from verl.engines.reference.rollout import HFRolloutEngine
from verl.engines.reference.rollout_weights import StaleWeightsError
from verl.engines.weight_sync.layout import TensorParallelLayout, local_shape
from verl.engines.weight_sync.reshard import ReshardStats, reshard_weights
from verl.protocol import DataProto
from verl.testing.memory import AllocationTracker
from verl.testing.tiny import make_tiny_tokenizer

# Full tensors of the reshard scenario: name -> shape. Row counts not divisible by the world make FSDP-style
# chunks that do not line up with the tensor-parallel slices.
RESHARD_SHAPES = {
    "model.layers.0.self_attn.q_proj.weight": (8, 6),  # colwise: rows split
    "model.layers.0.self_attn.q_proj.bias": (8,),
    "model.layers.0.self_attn.o_proj.weight": (6, 8),  # rowwise: columns split
    "model.layers.0.mlp.up_proj.weight": (10, 6),  # colwise, 10 rows: FSDP chunks 5/5, TP slices 5/5
    "model.embed_tokens.weight": (12, 6),  # vocab-parallel
    "model.norm.weight": (7,),  # replicated, 7 rows: FSDP chunks 4/3
    "lm_head.weight": (12, 6),
}
# Sharded on dim 1 by the "trainer": a placement the resharder cannot split, gathered whole instead.
COLUMN_SHARDED = "model.layers.0.mlp.down_proj.weight"
STYLES = {
    "model.layers.*.mlp.down_proj": "rowwise",
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.embed_tokens": "vocab",
    "lm_head": "colwise",
}
BUCKET = 512  # bytes: several buckets for these tensors, each weight alone fits one at TP=2
PROMPTS = ["hello world", "abc", "x y z 1 2 3", "RL!"]
RESPONSE_LENGTH = 8


def full_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=g) for name, shape in RESHARD_SHAPES.items()}


def column_sharded() -> torch.Tensor:
    return torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8)


def rollout_config(tp: int, **kw) -> SimpleNamespace:
    values = {
        "response_length": RESPONSE_LENGTH,
        "calculate_log_probs": True,
        "temperature": 1.0,
        "tensor_model_parallel_size": tp,
        **kw,
    }
    return SimpleNamespace(**values)


def prompt_batch(tok, *, seeds: bool) -> DataProto:
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    tensors = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}
    if seeds:
        tensors["sample_seed"] = torch.arange(len(PROMPTS), dtype=torch.int64) + 100
    return DataProto.from_dict(tensors=tensors)


def generate(engine, tok, *, greedy: bool) -> dict[str, torch.Tensor]:
    data = prompt_batch(tok, seeds=not greedy)
    data.meta_info = {"validate": True} if greedy else {}
    out = engine.generate(data).batch
    return {k: out[k].clone() for k in ("responses", "response_mask", "rollout_log_probs")}


def perturbed(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    new = {n: (t + 0.3 * torch.randn(t.shape, generator=g)).contiguous() for n, t in model.state_dict().items()}
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied: one tensor under two names
    return new


def reshard_scenario(rank: int, world: int, res: dict) -> None:
    full = full_tensors()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    sharded = [(n, distribute_tensor(t, mesh, [Shard(0)])) for n, t in full.items()]
    sharded.append(("model.layers.0.input_layernorm.weight", torch.arange(5.0)))  # a plain (replicated) tensor
    fallback = [(COLUMN_SHARDED, distribute_tensor(column_sharded(), mesh, [Shard(1)]))]
    for tp in (2, 1):
        layout = TensorParallelLayout(world, tp, STYLES)
        stats = ReshardStats()
        # The consumer copies into weights it already holds, as a rollout does: only the sync allocates.
        got = {n: torch.empty(local_shape(layout, n, tuple(t.shape), rank)) for n, t in sharded}
        with AllocationTracker() as tracker:
            for name, tensor in reshard_weights(sharded, layout, bucket_bytes=BUCKET, stats=stats):
                got[name].copy_(tensor)
        # The gather-whole fallback (outside the tracked bound: DTensor.full_tensor allocates as it pleases).
        fallback_stats = ReshardStats()
        for name, tensor in reshard_weights(fallback, layout, bucket_bytes=BUCKET, stats=fallback_stats):
            got[name] = tensor.clone()
        res[f"reshard_tp{tp}_fallback_gathers"] = fallback_stats.full_gathers
        res[f"reshard_tp{tp}"] = got
        res[f"reshard_tp{tp}_stats"] = stats.as_metrics()
        res[f"reshard_tp{tp}_tracker"] = {
            "peak": tracker.peak,
            "largest": tracker.largest,
            "shapes": tracker.shapes,
        }


def rollout_scenario(rank: int, out: Path, res: dict) -> None:
    model_dir = out / "tiny_model"
    tok = make_tiny_tokenizer()
    engine = HFRolloutEngine(model_dir, tok, rollout_config(2), device="cpu", options=HFRolloutOptions(sleep_level=2))
    res["layout"] = engine.weight_layout().describe()
    res["local_shapes"] = {n: tuple(engine.weights._targets()[n]._local_tensor.shape) for n in ("lm_head.weight",)}
    res["greedy"] = generate(engine, tok, greedy=True)
    res["sampled"] = generate(engine, tok, greedy=False)
    # A refused update (one wrong shape) writes nothing.
    new = perturbed(model_dir)
    bad = dict(new)
    bad["model.layers.0.mlp.up_proj.weight"] = bad["model.layers.0.mlp.up_proj.weight"][:, :-1]
    try:
        engine.check_weights([(n, tuple(t.shape)) for n, t in bad.items()])
        res["refused"] = None
    except ValueError as exc:
        res["refused"] = str(exc)
    res["greedy_after_refusal"] = generate(engine, tok, greedy=True)
    # Full tensors: each rank keeps its slices.
    engine.update_weights(iter(new.items()))
    res["greedy_perturbed"] = generate(engine, tok, greedy=True)
    # Level-2 sleep discards the weights; generating before the sync is refused; this rank's shards refill them.
    owned = engine.weights.owned_bytes()
    engine.sleep()
    res["owned_bytes"] = (owned, engine.weights.owned_bytes())
    engine.wake_up(["weights"])
    try:
        generate(engine, tok, greedy=True)
        res["stale_error"] = None
    except StaleWeightsError as exc:
        res["stale_error"] = str(exc)
    layout = engine.weight_layout()
    shards = {}
    for name, tensor in new.items():
        piece = layout.slice_for(name, tuple(tensor.shape), rank)
        shards[name] = tensor if piece is None else tensor.narrow(piece.dim, piece.start, piece.length).contiguous()
    engine.update_weights(iter(shards.items()))
    engine.wake_up(["kv_cache"])
    res["greedy_after_sleep"] = generate(engine, tok, greedy=True)


def run(out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    res: dict = {}
    reshard_scenario(rank, world, res)
    rollout_scenario(rank, out, res)
    torch.save(res, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
    os._exit(0)
