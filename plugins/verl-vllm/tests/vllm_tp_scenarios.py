"""vLLM tensor parallelism in the trainer's world (``python vllm_tp_scenarios.py OUT MODEL TP``).

Run on 2 gloo ranks by ``test_vllm_tensor_parallel.py``: each rank builds the ``vllm`` engine with
``tensor_model_parallel_size=TP`` (external launcher: TP=2 is one engine over both ranks, TP=1 one engine per
rank), generates, then takes a weight update resharded from FSDP-style ``Shard(0)`` DTensors (the hybrid
sync's path), and writes ``OUT/rank<R>.pt``. Not collected by pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

PROMPTS = ("What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with some words")


def rollout_config(tp: int):
    from verl.testing.conformance import make_rollout_config

    cfg = make_rollout_config(n=1, dtype="float32")
    cfg.tensor_model_parallel_size = tp
    return cfg


def outputs(engine, tokenizer) -> dict:
    from verl.testing.conformance import make_prompt_batch

    batch = make_prompt_batch(tokenizer, list(PROMPTS))
    out = {}
    for mode, meta in (("greedy", {"validate": True}), ("sampled", {})):
        tensors = {k: batch.batch[k] for k in batch.batch.keys()}
        if mode == "sampled":
            tensors["sample_seed"] = torch.arange(len(PROMPTS), dtype=torch.int64) + 11
        from verl.protocol import DataProto

        got = engine.generate(DataProto.from_dict(tensors=tensors, meta_info=meta)).batch
        keys = ("responses", "response_mask", "rollout_log_probs", "input_ids", "attention_mask", "position_ids")
        out[mode] = {k: got[k].clone() for k in keys}
    return out


def perturbed(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    new = {n: (t + 0.05 * torch.randn(t.shape, generator=g)).contiguous() for n, t in model.state_dict().items()}
    new["lm_head.weight"] = new["model.embed_tokens.weight"]  # tied: one tensor under two names
    return new


def run(out: Path, model_dir: Path, tp: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from verl_vllm.engine import VLLMRolloutEngine

    from verl.engines.weight_sync.reshard import ReshardStats, reshard_weights
    from verl.models import load_tokenizer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tokenizer = load_tokenizer(model_dir)
    from verl_vllm.options import VLLMRolloutOptions

    # The validated engine_kwargs.vllm, as the factory passes them.
    options = VLLMRolloutOptions(max_model_len=256, max_num_batched_tokens=256)
    engine = VLLMRolloutEngine(model_dir, tokenizer, rollout_config(tp), device="cpu", options=options)
    res = {"layout": engine.weight_layout().describe(), "before": outputs(engine, tokenizer)}
    # The hybrid sync: FSDP-style shards, resharded into whole tensors per rank, streamed into vLLM. The tied
    # model's state dict holds lm_head.weight and embed_tokens.weight as one tensor: only the first is sent.
    new = perturbed(model_dir)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    shared = distribute_tensor(new["model.embed_tokens.weight"], mesh, [Shard(0)])
    sharded = [
        (n, shared if n in ("lm_head.weight", "model.embed_tokens.weight") else distribute_tensor(t, mesh, [Shard(0)]))
        for n, t in new.items()
    ]
    engine.check_weights([(n, tuple(t.shape)) for n, t in sharded])
    stats = ReshardStats()
    engine.update_weights(reshard_weights(sharded, engine.weight_layout(), bucket_bytes=1 << 16, stats=stats))
    res["stats"] = stats.as_metrics()
    res["after"] = outputs(engine, tokenizer)
    torch.save(res, out / f"rank{rank}.pt")
    dist.barrier()
    engine.close()


if __name__ == "__main__":
    # A normal exit (not os._exit): vLLM's CPU shared-memory all-reduce unlinks its /dev/shm files in
    # destructors, and a file left behind makes the next engine with the same TP group fail (errno 17).
    run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
