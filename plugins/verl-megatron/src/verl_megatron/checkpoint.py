"""Checkpoints of the ``megatron`` engine: ``megatron.core.dist_checkpointing`` shards, and HF exports.

Layout of ``save(engine, folder)``::

    folder/
      dist_ckpt/            megatron.core.dist_checkpointing (torch_dist): model and optimizer, sharded tensors
      verl_megatron.json    counters, layout (tp, pp, dp, world), per-rank LR-scheduler states

Resume (:func:`load`) rebuilds the sharded state dicts of the running engine and lets ``dist_checkpointing``
read its shards, so the model loads under another tensor / pipeline layout too; the optimizer state is
refused on another layout (its shards are per layout unless Megatron's fully reshardable format is used,
which is not built), with that reason. ``verl export`` (:func:`merge_to_hf`) loads the model shards into a
one-process TP=1 copy and writes a HF folder.

Both read through :mod:`verl_megatron.safe_dist_ckpt`: megatron-core's own loaders would unpickle ``.metadata`` and
the shards' non-tensor values as arbitrary objects; those loaders admit only data and name a refused file. The
workers refuse loaded weights and optimizer state holding NaN/inf through the engine's ``nonfinite_state()``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl.engines.safe_files import read_json

MANIFEST = "verl_megatron.json"
DIST = "dist_ckpt"


# verl's metadata for megatron-core >= 0.14 (megatron_checkpoint_manager._build_sharded_state_dict_metadata):
# without it the distributed optimizer defaults to 'fully_sharded_model_space', whose flattened ShardedTensors
# megatron-core 0.16's dist_checkpointing rejects ("ShardedTensor.flattened_range is not supported").
_METADATA = {
    "distrib_optim_sharding_type": "dp_reshardable",
    "singleton_local_shards": False,
    "chained_optim_avoid_prefix": True,
}


def _sharded(engine: Any, *, is_loading: bool) -> dict[str, Any]:
    mm = engine.mm
    state: dict[str, Any] = {"model": mm.base.sharded_state_dict(metadata=dict(_METADATA))}
    if engine.trainable:
        state["optimizer"] = mm.optimizer.sharded_state_dict(
            state["model"], is_loading=is_loading, metadata=dict(_METADATA)
        )
    return state


def _ensure_optimizer_state(engine: Any) -> None:
    """Zero AdamW moments and step 0 for parameters without optimizer state (an engine that never stepped).

    Megatron's ``DistributedOptimizer.state_dict()`` (called by ``sharded_state_dict(is_loading=True)``) reads
    every parameter's ``step`` when neither Apex nor Transformer Engine is installed (the cpu case) and asserts
    there is one; Megatron's own ``init_state_fn`` sets only the moments. These zeros are overwritten by the
    checkpoint's state.
    """
    for inner in engine.mm._inner_optimizers():
        torch_opt = getattr(inner, "optimizer", None)
        for group in getattr(torch_opt, "param_groups", []):
            for param in group["params"]:
                state = torch_opt.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param.data)
                    state["exp_avg_sq"] = torch.zeros_like(param.data)


def _restore_steps(engine: Any) -> None:
    """Adam's per-parameter ``step`` from the loaded param groups' ``step`` (Megatron's one common step).

    ``DistributedOptimizer.load_state_dict`` sets it, then ``load_parameter_state_from_dp_reshardable`` copies
    every optimizer-state key of the load template over it, ``step`` included: the template's, not the
    checkpoint's (measured: a checkpoint after step 1 resumed at step 0, a wrong bias correction).
    """
    for inner in engine.mm._inner_optimizers():
        torch_opt = getattr(inner, "optimizer", None)
        for group in getattr(torch_opt, "param_groups", []):
            if group.get("step") is None:
                continue
            for param in group["params"]:
                state = torch_opt.state.get(param)
                if state and "step" in state:
                    state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)


def save(engine: Any, folder: Any) -> None:
    """Write model + optimizer shards and the counters under ``folder`` (collective)."""
    from megatron.core import dist_checkpointing

    folder = Path(folder)
    target = folder / DIST
    if dist.get_rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    with engine.mm.compat(optimizer=True):
        dist_checkpointing.save(_sharded(engine, is_loading=False), str(target))
    schedulers: list[Any] = [None] * dist.get_world_size()
    mine = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
    dist.all_gather_object(schedulers, mine)
    if dist.get_rank() == 0:
        info = {
            "format": "verl-megatron/1",
            "global_step": engine.global_step,
            "skipped_steps": engine.skipped_steps,
            "layout": {k: v for k, v in engine.mm.layout_key().items() if k != "rank"},
            "trainable": engine.trainable,
            "lr_scheduler": schedulers[0],
        }
        (folder / MANIFEST).write_text(json.dumps(info, indent=2, default=str) + "\n")
    dist.barrier()


def read_manifest(folder: Any) -> dict[str, Any]:
    """The ``verl_megatron.json`` of a checkpoint folder.

    Raises:
        FileNotFoundError: not a verl-megatron checkpoint (names what is there).
        CheckpointFileError: ``verl_megatron.json`` is not valid JSON (truncated?) or not an object.
    """
    path = Path(folder) / MANIFEST
    if not path.is_file() or not (Path(folder) / DIST).is_dir():
        have = sorted(p.name for p in Path(folder).iterdir()) if Path(folder).is_dir() else "no such folder"
        raise FileNotFoundError(f"{folder} is not a verl-megatron checkpoint (no {MANIFEST} + {DIST}/; found {have})")
    return read_json(path)


def load(engine: Any, folder: Any) -> None:
    """Restore :func:`save` output into ``engine`` (collective).

    Every file is read as data (:mod:`verl_megatron.safe_dist_ckpt`).

    Raises:
        FileNotFoundError: not a verl-megatron checkpoint.
        ValueError: optimizer state written under another parallel layout.
        CheckpointFileError: a file that is not data (a planted pickle), missing, truncated or corrupt (names it).
    """
    from verl_megatron import safe_dist_ckpt

    info = read_manifest(folder)
    layout = {k: v for k, v in engine.mm.layout_key().items() if k != "rank"}
    same = info["layout"] == layout
    if engine.trainable and not same:
        raise ValueError(
            f"checkpoint {folder} was written with layout {info['layout']}, this run is {layout}: the model shards "
            "would load, but the optimizer state is stored per layout; resume with the same parallel sizes and "
            "world size, or `verl export` the checkpoint and start a new run from the HF folder"
        )
    # no_grad: the distributed optimizer copies the loaded main params into views of the model's parameters.
    with torch.no_grad(), engine.mm.compat(optimizer=True):
        if engine.trainable:
            _ensure_optimizer_state(engine)
        template = _sharded(engine, is_loading=True)
        loaded = safe_dist_ckpt.load(template, Path(folder) / DIST)
        engine.mm.base.load_state_dict(loaded["model"], strict=False)
        if engine.trainable:
            engine.mm.optimizer.load_state_dict(loaded["optimizer"])
            _restore_steps(engine)
    engine.mm.optimizer_reload() if engine.trainable else None
    engine.global_step = int(info["global_step"])
    engine.skipped_steps = int(info["skipped_steps"])
    if engine.trainable and info.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(info["lr_scheduler"])


def write_hf(engine: Any, path: Any, tokenizer: Any = None) -> None:
    """Gather the full weights (collective) and write a ``from_pretrained`` folder on rank 0."""
    full = {name: tensor.detach().to("cpu") for name, tensor in engine.mm.hf_weights()}
    if dist.get_rank() == 0:
        write_hf_folder(engine.mm.hf_config, full, path, value_model=engine.mm.value_model)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
    del full
    dist.barrier()


def write_hf_folder(hf_config: Any, state: dict[str, torch.Tensor], path: Any, *, value_model: bool = False) -> None:
    """A HF model of ``hf_config`` holding ``state`` (HF names), saved with ``use_cache: true``; ``value_model``:
    an ``AutoModelForTokenClassification`` with one label (the critic's layout, ``score.*``)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    config = copy.deepcopy(hf_config)
    if value_model:
        config.num_labels = 1
    with torch.device("meta"):
        model = (AutoModelForTokenClassification if value_model else AutoModelForCausalLM).from_config(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.config.use_cache = True
    model.save_pretrained(str(path))


def merge_to_hf(actor_folder: Any, hf_source: Any, out_folder: Any) -> Path:
    """``verl export``: a verl-megatron checkpoint (any layout) to a HF folder, in this one process.

    Args:
        actor_folder: the folder :func:`save` wrote (``.../actor``).
        hf_source: a HF folder with the model's config (the checkpoint's ``huggingface/``).
        out_folder: where the HF folder goes.

    Raises:
        FileNotFoundError: not a verl-megatron checkpoint.
        RuntimeError: a torch.distributed group already exists in this process (export runs alone).
        CheckpointFileError: a file that is not data, missing, truncated or corrupt (names it).
    """
    import os

    from verl.engines.reference.training import EngineSettings
    from verl_megatron.engine import MegatronTrainingEngine
    from verl_megatron.options import MegatronEngineOptions

    read_manifest(actor_folder)
    if dist.is_initialized():
        raise RuntimeError("merge_to_hf runs in a process of its own (a torch.distributed group exists here)")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)
    engine = MegatronTrainingEngine(
        hf_source, EngineSettings(), options=MegatronEngineOptions(dtype="float32"), device="cpu", load_weights=False
    )
    try:
        from verl_megatron import safe_dist_ckpt

        with engine.mm.compat():
            loaded = safe_dist_ckpt.load({"model": engine.mm.base.sharded_state_dict()}, Path(actor_folder) / DIST)
        engine.mm.base.load_state_dict(loaded["model"], strict=False)
        write_hf(engine, out_folder)
    finally:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        dist.destroy_process_group()
    return Path(out_folder)
