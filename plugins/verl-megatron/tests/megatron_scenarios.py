"""Two-rank Megatron scenarios run as a script by the tests, one parallel layout per launch.

``python megatron_scenarios.py OUT_DIR LAYOUT MODEL OTHER_MODEL`` on 2 gloo ranks (``RANK``/``WORLD_SIZE``/
``MASTER_*`` set by ``verl.testing.distributed.run_ranks``, see ``conftest.py``), ``LAYOUT`` one of
:data:`LAYOUTS`. Megatron's parallel state is per process, so each layout needs its own launch; every engine of a
launch shares it and ``destroy_model_parallel`` runs once, at the end. Each rank writes
``OUT_DIR/<LAYOUT>_rank<R>.pt``; the tests compare it with core's reference engine (one process, whole batch).

``python megatron_scenarios.py OUT_DIR export CKPT MODEL`` on 1 rank: what needs a world of one after the TP=2
launch (a TP=1 trainable engine refusing the TP=2 checkpoint, a TP=1 forward-only engine reading it, and
``verl_megatron.checkpoint.merge_to_hf``, which makes its own 1-rank group); writes ``OUT_DIR/export.pt``.

Engines are built the way the worker builds them: ``load_config`` of the conformance kit's overrides, the
plugin manager's ``megatron`` spec, ``build_training_engine(..., world_size=2)``. Not collected by pytest (no
``test_`` prefix); the tests import its constants by path.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from verl.testing.conformance.build import build_training_engine, engine_overrides
from verl.testing.conformance.inputs import make_training_batch
from verl.testing.conformance.training import ROWS, training_overrides

WORLD = 2
STEPS = 2  # the kit's two updates: the first at the warm-up's lr 0 (fills AdamW's moments), the second moves
TOTAL_TRAINING_STEPS = 4  # the kit's LR-schedule horizon; the reference oracle uses the same
# engine_kwargs.megatron of each launch. DP=2 keeps the default distributed optimizer (ZeRO-1 over the 2 ranks);
# TP=2 and PP=2 have dp=1, where the distributed optimizer holds everything on one rank.
LAYOUTS: dict[str, dict[str, Any]] = {
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "dp2": {"use_distributed_optimizer": True},
}


def rows_of(layout: str, rank: int) -> slice:
    """The batch rows rank ``rank`` receives: all 8 when dp=1 (one replica), ``[4r, 4r + 4)`` at DP=2."""
    if layout == "dp2":
        half = ROWS // WORLD
        return slice(rank * half, (rank + 1) * half)
    return slice(0, ROWS)


def megatron_config(model: Any, layout_kwargs: dict[str, Any], overrides: list[str] = ()) -> Any:
    """RootConfig of ``strategy=megatron`` with the kit's settings, ``layout_kwargs`` as ``engine_kwargs.megatron``."""
    from verl.config import load_config

    return load_config(
        overrides=[
            *training_overrides(model, "megatron"),
            *engine_overrides("training_engine", "megatron", layout_kwargs),
            *overrides,
        ]
    )


def weights(engine: Any) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in engine.iter_weights()}


def optimizer_tensors(engine: Any) -> dict[str, torch.Tensor]:
    """Copies of every inner torch optimizer's main parameters and per-parameter state (moments, step), named
    ``optimizer{i}.group{g}.param{p}[.key]`` by place."""
    out = {}
    for i, inner in enumerate(engine.mm._inner_optimizers()):
        opt = inner.optimizer
        for g, group in enumerate(opt.param_groups):
            for p, param in enumerate(group["params"]):
                out[f"optimizer{i}.group{g}.param{p}"] = param.detach().clone()
                for key, value in opt.state.get(param, {}).items():
                    out[f"optimizer{i}.group{g}.param{p}.{key}"] = torch.as_tensor(value).detach().clone()
    return out


def log_probs(engine: Any, data: Any, *, entropy: bool = False) -> dict[str, torch.Tensor]:
    out = engine.compute_log_prob(data, calculate_entropy=entropy)
    return {k: out.batch[k].detach().cpu().clone() for k in out.batch.keys()}


def serialised(state: Any) -> Any:
    """``torch.save`` then ``torch.load``: what a checkpoint does, so later training cannot alias the state."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _tp2_extras(make: Any, data: Any, loss_fn: Any, out: Path, res: dict) -> None:
    """Gradient accumulation, state_dict round trip, dist checkpoint resume and save_hf (TP=2 only)."""
    # Gradient accumulation: 8 micro-batches of 1 row vs one of 8 rows, two updates each.
    for name, micro in (("micro1", 1), ("micro8", ROWS)):
        eng = make([f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}"])
        res[f"{name}_metrics"] = [eng.train_batch(data, loss_fn) for _ in range(STEPS)]
        res[f"{name}_weights"] = weights(eng)
    # state_dict round trip of this rank: save after step 1, step 2, load, step 2 again.
    eng = make()
    eng.train_batch(data, loss_fn)
    saved = serialised(eng.state_dict())
    res["sd_saved_logp"] = log_probs(eng, data)
    res["sd_second_metrics"] = eng.train_batch(data, loss_fn)
    res["sd_second_weights"] = weights(eng)
    eng.load_state_dict(saved)
    res["sd_restored_logp"] = log_probs(eng, data)
    res["sd_restored_step"] = eng.global_step
    res["sd_again_metrics"] = eng.train_batch(data, loss_fn)
    res["sd_again_weights"] = weights(eng)
    # dist_checkpointing: save after one step, a fresh engine (other initial weights) loads it and steps.
    eng = make()
    eng.train_batch(data, loss_fn)
    eng.save_checkpoint(out / "ckpt_tp2")
    res["ckpt_weights"] = weights(eng)
    res["ckpt_optimizer"] = optimizer_tensors(eng)
    res["continued_metrics"] = eng.train_batch(data, loss_fn)
    res["continued_weights"] = weights(eng)
    eng.save_hf(out / "hf_tp2")
    fresh = make(model_key="other")
    res["fresh_weights"] = weights(fresh)
    fresh.load_checkpoint(out / "ckpt_tp2")
    res["loaded_weights"] = weights(fresh)
    res["loaded_optimizer"] = optimizer_tensors(fresh)
    res["loaded_nonfinite"] = fresh.nonfinite_state()
    res["loaded_step"] = fresh.global_step
    res["resumed_metrics"] = fresh.train_batch(data, loss_fn)
    res["resumed_weights"] = weights(fresh)


def run(out: Path, layout: str, model: str, other: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from verl_megatron.parallel import ensure_process_group

    from verl.plugins import get_plugin_manager
    from verl.workers.losses import make_ppo_loss

    ensure_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == WORLD, dist.get_world_size()
    spec = get_plugin_manager().get("training_engine", "megatron")
    paths = {"model": model, "other": other}
    layout_kwargs = LAYOUTS[layout]

    def make(overrides: list[str] = (), *, role: str = "actor", model_key: str = "model") -> Any:
        cfg = megatron_config(paths[model_key], layout_kwargs, list(overrides))
        return build_training_engine(
            spec,
            cfg,
            model=paths[model_key],
            role=role,
            world_size=WORLD,
            total_training_steps=TOTAL_TRAINING_STEPS,
        )

    data = make_training_batch()[rows_of(layout, rank)]
    loss_fn = make_ppo_loss(megatron_config(model, layout_kwargs).actor_rollout_ref.actor)
    res: dict[str, Any] = {"layout": layout, "rank": rank}
    actor = make()
    res["dispatch"] = actor.dispatch_info()
    res["place"] = {k: getattr(actor.place, k) for k in ("tp_rank", "tp_size", "pp_rank", "pp_size", "dp_rank")}
    res["logp"] = log_probs(actor, data, entropy=True)
    ref = make(role="ref")
    res["ref_logp"] = log_probs(ref, data, entropy=True)
    del ref
    res["metrics"] = [actor.train_batch(data, loss_fn) for _ in range(STEPS)]
    res["weights"] = weights(actor)
    del actor
    if layout == "tp2":
        _tp2_extras(make, data, loss_fn, out, res)
    torch.save(res, out / f"{layout}_rank{rank}.pt")
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


class Plant:
    """Unpickling this creates the file ``marker`` (the stand-in for code planted in a checkpoint)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def export(out: Path, ckpt: str, model: str) -> None:
    """World-1 checks on the TP=2 checkpoint ``ckpt``: layout refusal, TP=1 forward-only load, merge_to_hf, and
    merge_to_hf of a copy whose DCP ``.metadata`` is a planted pickle."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from verl_megatron.checkpoint import merge_to_hf
    from verl_megatron.parallel import ensure_process_group

    from verl.plugins import get_plugin_manager

    ensure_process_group("gloo")
    spec = get_plugin_manager().get("training_engine", "megatron")
    cfg = megatron_config(model, {})
    res: dict[str, Any] = {}
    trainable = build_training_engine(spec, cfg, model=model, total_training_steps=TOTAL_TRAINING_STEPS)
    try:
        trainable.load_checkpoint(ckpt)
        res["refusal"] = None
    except ValueError as exc:
        res["refusal"] = str(exc)
    del trainable
    forward_only = build_training_engine(spec, cfg, model=model, role="ref")
    forward_only.load_checkpoint(ckpt)
    res["tp1_ref_weights"] = weights(forward_only)
    del forward_only
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    res["merged"] = str(merge_to_hf(ckpt, model, out / "merged_tp2"))
    planted, marker = out / "ckpt_tp2_planted", out / "export_planted_ran"
    shutil.copytree(ckpt, planted)
    (planted / "dist_ckpt" / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    try:
        merge_to_hf(planted, model, out / "merged_planted")
        res["planted_error"] = None
    except BaseException as exc:  # whatever the planted file gives (DCP's CheckpointException is a BaseException)
        res["planted_error"] = f"{type(exc).__name__}: {exc}"
    res["planted_ran"] = marker.exists()
    torch.save(res, out / "export.pt")


if __name__ == "__main__":
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "export":
        export(out_dir, sys.argv[3], sys.argv[4])
    else:
        run(out_dir, mode, sys.argv[3], sys.argv[4])
    # dist_checkpointing.save starts a multiprocessing Manager (its write-results queue) that inherits this rank's
    # stdout; ended here, or the launcher would wait on the pipe it holds after os._exit.
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(timeout=10)
    os._exit(0)  # skip interpreter teardown (gloo / Megatron globals), as fsdp_scenarios does
