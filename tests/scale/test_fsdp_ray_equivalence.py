"""FSDP2 on 2 Ray actors (gloo) equals the single-process reference engine (issue: scale out).

Both sides run the real hybrid worker (:class:`verl.workers.actor_rollout_ref.ActorRolloutRefWorker`)
with the real PPO loss, on the same global batch:

* per-token log-probs within 1e-5 (absolute);
* loss metrics and grad norm within 1e-5 (relative) on each of 3 optimizer steps;
* weights after the 3 steps within 1e-5 (absolute), compared through the exported HF folders;
* 1 micro-batch (reference) vs 4 micro-batches per rank (FSDP): gradient accumulation changes nothing;
* ``token-mean`` over uneven response lengths (the two ranks hold different token counts).

Then ``verl train`` itself: ``trainer.controller=ray trainer.n_gpus_per_node=2 actor.strategy=fsdp``
against the local run: identical validation before training and step-1 metrics within tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray")
pytest.importorskip("verl_fsdp")

from safetensors.torch import load_file  # noqa: E402

from verl.config import load_config  # noqa: E402
from verl.controller import ClassWithInitArgs, LocalWorkerGroup  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker  # noqa: E402

pytestmark = pytest.mark.multiprocess

PROMPT_LEN, RESP_LEN, ROWS = 6, 7, 8


def _config(model_dir: Path, *, distributed: bool, micro: int = 2):
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        "data.train_batch_size=4",
        "data.max_prompt_length=8",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one optimizer step per update_actor call
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.optim.lr=0.005",  # Adam turns float-rounding noise of tiny grads into lr-sized steps
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "algorithm.adv_estimator=grpo",
    ]
    if distributed:
        overrides += ["trainer.controller=ray", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp"]
    return load_config(overrides=overrides)


def _batch(seed: int = 0) -> DataProto:
    """8 rows, left-padded prompts, right-padded responses of uneven lengths (rank 0 gets more tokens)."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, 100, (ROWS, PROMPT_LEN), generator=gen)
    prompt_mask = torch.ones(ROWS, PROMPT_LEN, dtype=torch.long)
    prompt_mask[1, :3] = 0
    prompt_mask[6, :2] = 0
    resp_lens = torch.tensor([7, 7, 6, 5, 2, 1, 3, 1])
    response_mask = (torch.arange(RESP_LEN)[None, :] < resp_lens[:, None]).long()
    responses = torch.randint(5, 100, (ROWS, RESP_LEN), generator=gen) * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompt * prompt_mask, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": torch.clip(torch.cumsum(attention_mask, -1) - 1, min=0),
            "prompts": prompt * prompt_mask,
            "responses": responses,
            "response_mask": response_mask,
            # Mostly positive: a loss of order 1, so "relative" measures the engines, not cancellation.
            "advantages": (torch.randn(ROWS, RESP_LEN, generator=gen) * 0.5 + 1.0) * response_mask,
        },
        meta_info={"temperature": 0.9},
    )


def _groups(model_dir: Path):
    from verl.controller.ray import RayResourcePool, RayWorkerGroup

    # 1 micro-batch of 8 rows in one process vs 4 micro-batches of 1 row on each of 2 ranks.
    local_cfg = _config(model_dir, distributed=False, micro=8)
    local = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, local_cfg, "actor"))
    pool = RayResourcePool([2])
    dist_cfg = _config(model_dir, distributed=True, micro=1)
    dist = RayWorkerGroup(pool, ClassWithInitArgs(ActorRolloutRefWorker, dist_cfg, "actor"))
    return local, dist


def _mean_metrics(out: DataProto) -> dict[str, float]:
    return {k: sum(v) / len(v) for k, v in out.meta_info["metrics"].items() if not k.startswith("perf/")}


def test_fsdp_dp2_on_ray_matches_reference(ray_runtime, model_dir: Path, tmp_path: Path) -> None:
    local, dist = _groups(model_dir)
    try:
        local.init_model(3)
        dist.init_model(3)
        batch = _batch()
        # Uneven split on purpose: rank 0 holds rows 0-3 (25 response tokens), rank 1 rows 4-7 (7 tokens).
        assert int(batch.batch["response_mask"][:4].sum()) == 25 and int(batch.batch["response_mask"][4:].sum()) == 7

        ref_lp = local.compute_log_prob(batch)
        dist_lp = dist.compute_log_prob(batch)
        diff = (ref_lp.batch["old_log_probs"] - dist_lp.batch["old_log_probs"]).abs().max().item()
        assert diff <= 1e-5, f"log-probs differ by {diff}"
        # Padding slots stay 0 on both sides.
        assert bool((dist_lp.batch["old_log_probs"][batch.batch["response_mask"] == 0] == 0).all())

        train = batch.union(DataProto.from_dict(tensors={"old_log_probs": ref_lp.batch["old_log_probs"]}))
        for step in range(3):
            want = _mean_metrics(local.update_actor(train))
            got = _mean_metrics(dist.update_actor(train))
            for key in ("actor/pg_loss", "actor/loss", "actor/entropy_loss", "actor/grad_norm"):
                assert got[key] == pytest.approx(want[key], rel=1e-5), (step, key, got[key], want[key])
            # ppo_kl is a mean of log-prob differences (cancellation): compared absolutely.
            for key in ("actor/ppo_kl", "actor/pg_clipfrac"):
                assert got[key] == pytest.approx(want[key], abs=1e-6), (step, key, got[key], want[key])
            assert got["actor/lr"] == pytest.approx(want["actor/lr"], rel=1e-12)
            assert want["actor/grad_norm"] > 0

        local_dir, dist_dir = local.export_hf(str(tmp_path / "local"))[0], dist.export_hf(str(tmp_path / "dist"))[0]
        a = load_file(str(Path(local_dir) / "model.safetensors"))
        b = load_file(str(Path(dist_dir) / "model.safetensors"))
        assert set(a) == set(b)
        worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        assert worst <= 1e-5, f"weights after 3 steps differ by {worst}"
        start = load_file(str(model_dir / "model.safetensors"))
        assert max((a[k] - start[k]).abs().max().item() for k in start) > 1e-3  # the weights really moved
    finally:
        dist.shutdown()


# ---------------------------------------------------------------------- verl train, ray + fsdp vs local


def test_verl_train_on_ray_fsdp_matches_local_first_step(ray_runtime, run_train, tmp_path: Path) -> None:
    local = run_train(tmp_path / "local")
    dist = run_train(
        tmp_path / "ray",
        "trainer.controller=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.strategy=fsdp",
        "trainer.save_freq=1",
    )
    (val_local, step_local), (val_dist, step_dist) = local, dist
    # Greedy validation before training: same weights, same prompts -> same text and scores.
    assert val_dist["val-core/openai/gsm8k/acc/mean@1"] == val_local["val-core/openai/gsm8k/acc/mean@1"]
    for key in ("val-aux/openai/gsm8k/reward/mean@1",):
        if key in val_local:
            assert val_dist[key] == pytest.approx(val_local[key], abs=1e-6)
    # Per-row sampler seeds: the 2-rank rollout samples the same responses as the 1-rank one.
    for key in ("response_length/mean", "critic/score/mean", "critic/advantages/mean"):
        assert step_dist[key] == pytest.approx(step_local[key], abs=1e-6), key
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert step_dist[key] == pytest.approx(step_local[key], rel=1e-4, abs=1e-6), key
    assert "global_seqlen/balanced_max" in step_dist and "global_seqlen/balanced_max" not in step_local
    # The sharded (DCP) checkpoint merges into the same weights as the final export.
    from verl.cli.main import main as verl_main

    step1 = tmp_path / "ray" / "ckpt" / "global_step_1"
    assert json.loads((step1 / "actor" / "checkpoint.json").read_text()) == {"strategy": "fsdp", "world_size": 2}
    assert verl_main(["export", str(step1), str(tmp_path / "merged")]) == 0
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    final = load_file(str(tmp_path / "ray" / "final_hf" / "model.safetensors"))
    assert merged.keys() == final.keys() and all(torch.equal(merged[k], final[k]) for k in final)
