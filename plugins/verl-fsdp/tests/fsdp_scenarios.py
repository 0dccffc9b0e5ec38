"""Two-rank FSDP scenarios run as a script by the tests (``python fsdp_scenarios.py OUT_DIR``).

Each rank (``RANK``/``WORLD_SIZE``/``MASTER_*`` set by the launcher in ``conftest.py``) takes its half of
the global batch of :func:`make_batch`, runs every scenario and writes ``OUT_DIR/rank<R>.pt``; the
tests compare those results with a single-process ``ReferenceTrainingEngine`` on the full batch.
Not collected by pytest (no ``test_`` prefix); the tests also import its helpers by path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from verl.algorithms import agg_loss
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.protocol import DataProto
from verl.testing.batches import ragged_rl_batch
from verl.testing.tiny import make_tiny_model

PROMPT_LEN, RESP_LEN, ROWS = 6, 8, 8
# Rows 0-3 (rank 0) have long responses, rows 4-7 (rank 1) short ones and one empty one, so
# per-rank token means differ from the global token mean and dynamic plans differ in length.
PROMPT_LENS = [6, 5, 4, 6, 2, 3, 1, 2]
RESP_LENS = [8, 7, 6, 8, 1, 0, 2, 1]
TEMPERATURE = 0.7
STEPS = 3
MODEL_SEED = 1


def make_batch(seed: int = 0) -> DataProto:
    """The global batch: left-padded prompts, right-padded responses, advantages and old log-probs."""
    g = torch.Generator().manual_seed(seed)
    data = ragged_rl_batch(PROMPT_LENS, RESP_LENS, PROMPT_LEN, RESP_LEN, g, meta_info={"temperature": TEMPERATURE})
    rmask = data.batch["response_mask"]
    data.batch["advantages"] = torch.randn(ROWS, RESP_LEN, generator=g) * rmask
    data.batch["old_log_probs"] = (-3.0 - torch.rand(ROWS, RESP_LEN, generator=g)) * rmask
    return data


def token_mean_loss(micro, outputs, norm):
    """-A * log p aggregated by token-mean with the global normalisers; metric = additive contribution."""
    mask = micro.batch["response_mask"]
    loss = agg_loss(-micro.batch["advantages"] * outputs["log_probs"], mask, "token-mean", **norm)
    return loss, {"test/loss": float(loss.detach()) / norm["dp_size"]}


token_mean_loss.needs_entropy = False


def optim(lr: float = 1e-2) -> SimpleNamespace:
    return SimpleNamespace(lr=lr, betas=(0.9, 0.999), weight_decay=0.01, lr_warmup_steps=0)


def settings(**kw) -> EngineSettings:
    """Per-rank settings for a global mini-batch of ``ROWS`` rows (the reference passes ``ROWS``)."""
    return EngineSettings(**{"mini_batch_size": ROWS // 2, "micro_batch_size": 2, "clip_grad": 1.0, **kw})


def train(engine, data, loss_fn, steps: int = STEPS) -> list[dict]:
    return [engine.train_batch(data, loss_fn) for _ in range(steps)]


def weights(engine) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in engine.iter_weights()}


def ppo_config(model_path: str, strategy: str):
    from verl.config import load_config

    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_path}",
            f"actor_rollout_ref.actor.strategy={strategy}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={ROWS}",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        ]
    )


SYNC_BUCKET = 4096  # bytes: several resharding buckets for the tiny model
SYNC_PROMPTS = ["hello world", "abc", "x y z 1 2 3", "RL!"]


def rollout_config(tp: int) -> SimpleNamespace:
    return SimpleNamespace(
        response_length=6, calculate_log_probs=True, temperature=1.0, tensor_model_parallel_size=tp, engine_kwargs={}
    )


def rollout_outputs(engine) -> dict[str, torch.Tensor]:
    """Greedy and seeded-sampling generations of :data:`SYNC_PROMPTS` (the oracle runs the same)."""
    from verl.testing.tiny import make_tiny_tokenizer

    enc = make_tiny_tokenizer()(SYNC_PROMPTS, return_tensors="pt", padding=True)
    out = {}
    for mode, meta in (("greedy", {"validate": True}), ("sampled", {})):
        tensors = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}
        if mode == "sampled":
            tensors["sample_seed"] = torch.arange(len(SYNC_PROMPTS), dtype=torch.int64) + 7
        batch = engine.generate(DataProto.from_dict(tensors=tensors, meta_info=meta)).batch
        out[mode] = {k: batch[k].clone() for k in ("responses", "response_mask", "rollout_log_probs")}
    return out


def hybrid_sync(trainer, model_dir: Path, tp: int) -> dict:
    """A fresh hf rollout (from the untrained checkpoint) synced from ``trainer``; what moved, what it cost."""
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine, ColocatedOptions
    from verl.testing.memory import AllocationTracker
    from verl.testing.tiny import make_tiny_tokenizer

    rollout = HFRolloutEngine(model_dir, make_tiny_tokenizer(), rollout_config(tp), device="cpu")
    section = SimpleNamespace(update_weights_bucket_megabytes=1)
    with AllocationTracker() as tracker:
        metrics = ColocatedCheckpointEngine(section, options=ColocatedOptions(bucket_bytes=SYNC_BUCKET)).sync(
            trainer, rollout
        )
    local = {
        n: tuple(t.to_local().shape) if hasattr(t, "to_local") else tuple(t.shape)
        for n, t in rollout.model.state_dict().items()
    }
    return {
        "metrics": metrics,
        "peak": tracker.peak,
        "shapes": tracker.shapes,
        "local_shapes": local,
        "outputs": rollout_outputs(rollout),
    }


def run(out: Path) -> None:
    import torch.distributed as dist
    from verl_fsdp.builder import build_fsdp_training_engine
    from verl_fsdp.dist import ensure_process_group
    from verl_fsdp.engine import FSDPTrainingEngine
    from verl_fsdp.options import FSDPEngineOptions

    from verl.config import role_options
    from verl.workers.losses import make_ppo_loss

    FSDP_SPEC = SimpleNamespace(options_cls=FSDPEngineOptions)  # noqa: N806  (role_options reads options_cls only)
    ensure_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, world
    half = ROWS // world
    local = make_batch()[rank * half : (rank + 1) * half]
    res: dict = {}

    def engine(opts=None, **kw):
        return FSDPTrainingEngine(
            make_tiny_model(seed=MODEL_SEED), settings(**kw), options=opts, optim=optim(), total_training_steps=10
        )

    # 1. log-probs (+ entropy) with fixed and with token-budget micro-batches; 2 vs 1 micro-batches per rank.
    eng = engine(infer_micro_batch_size=1)
    res["logp"] = eng.compute_log_prob(local, calculate_entropy=True).batch.to_dict()
    eng = engine(infer_use_dynamic_bsz=True, infer_max_token_len=28)
    res["logp_dynamic"] = eng.compute_log_prob(local).batch["old_log_probs"]
    # 2. training: 2 and 4 micro-batches per rank, and token-budget plans of different lengths per rank.
    for name, kw in {
        "micro2": {"micro_batch_size": 2},
        "micro1": {"micro_batch_size": 1},
        "dynamic": {"use_dynamic_bsz": True, "max_token_len": 28},
    }.items():
        eng = engine(**kw)
        plan_args = {"use_dynamic": kw.get("use_dynamic_bsz", False), "micro": kw.get("micro_batch_size", 2)}
        plan_args["max_tokens"] = kw.get("max_token_len", 16384)
        res[f"{name}_plan_len"] = len(eng._plan(local, **plan_args))  # after equalising over ranks
        res[f"{name}_local_plan_len"] = len(ReferenceTrainingEngine._plan(local, **plan_args))
        res[f"{name}_metrics"] = train(eng, local, token_mean_loss)
        eng.bucket_bytes = 4096  # several all-gather buckets for the tiny model
        res[f"{name}_weights"] = weights(eng)
    # 3. HSDP mesh (replicate 2 x shard 1) follows the same math.
    eng = engine(FSDPEngineOptions(fsdp_size=1))
    res["hsdp_mesh"] = list(eng.mesh.shape)
    res["hsdp_metrics"] = train(eng, local, token_mean_loss)
    res["hsdp_weights"] = weights(eng)
    # 4. the real PPO loss through the plugin's factory (gradient checkpointing on, seq-mean-token-mean).
    model_dir = out / "tiny_model"
    if rank == 0:
        make_tiny_model(seed=MODEL_SEED).save_pretrained(str(model_dir))
    dist.barrier()
    cfg = ppo_config(str(model_dir), "fsdp")
    eng = build_fsdp_training_engine(
        cfg,
        role="actor",
        model=str(model_dir),
        options=role_options(cfg, "actor", FSDP_SPEC),
        total_training_steps=10,
        world_size=2,
    )
    res["ppo_metrics"] = train(eng, local, make_ppo_loss(cfg.actor_rollout_ref.actor))
    res["ppo_weights"] = weights(eng)
    ref = build_fsdp_training_engine(
        cfg, role="ref", model=str(model_dir), options=role_options(cfg, "ref", FSDP_SPEC), world_size=2
    )
    res["ref_logp"] = ref.compute_log_prob(local).batch["old_log_probs"]
    # 5. checkpoints: DCP and sharded state_dict round trips into fresh engines with other weights.
    eng = engine()
    train(eng, local, token_mean_loss, steps=1)
    eng.save_checkpoint(out / "dcp")
    torch.save(eng.state_dict(), out / f"sharded_rank{rank}.pt")
    res["ckpt_weights"] = weights(eng)
    res["after_metrics"] = train(eng, local, token_mean_loss, steps=1)
    res["after_weights"] = weights(eng)
    for how in ("dcp", "state_dict"):
        fresh = FSDPTrainingEngine(make_tiny_model(seed=7), settings(), optim=optim(), total_training_steps=10)
        if how == "dcp":
            fresh.load_checkpoint(out / "dcp")
        else:
            fresh.load_state_dict(torch.load(out / f"sharded_rank{rank}.pt", weights_only=False))
        res[f"{how}_loaded_weights"] = weights(fresh)
        res[f"{how}_global_step"] = fresh.global_step
        res[f"{how}_resumed_metrics"] = train(fresh, local, token_mean_loss, steps=1)
        res[f"{how}_resumed_weights"] = weights(fresh)
    eng.save_hf(out / "hf", tokenizer=None)
    # 6. the hybrid engine's sync: FSDP DP=2 shards -> hf rollout TP=2 (one replica) and TP=1 (two replicas).
    eng = engine(micro_batch_size=2)
    train(eng, local, token_mean_loss)
    res["sync_weights"] = weights(eng)
    for tp in (2, 1):
        res[f"sync_tp{tp}"] = hybrid_sync(eng, model_dir, tp)
    torch.save(res, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
    os._exit(0)
