"""Disk checkpoints of the FSDP engine: sharded ``torch.distributed.checkpoint`` (DCP) and HF export.

Layout of a checkpoint folder written by :func:`save_dcp` (every rank takes part):

* ``*.distcp`` + ``.metadata``: DCP shards of ``{"model": ..., "optimizer": ...}`` (state-dict keys are
  HF parameter names, flattened by DCP to ``model.<hf_name>``); with LoRA only the adapter parameters
  (``...lora_A.default.weight``) and their optimizer state, the frozen base being the model folder;
* ``extra_state_world_size_<W>_rank_<R>.pt``: LR scheduler state and step counters of rank ``R`` (tensors and plain
  data, read with ``torch.load(weights_only=True)``);
* ``verl_fsdp.json``: world size, mesh and trainability (written by rank 0);
* ``hf_config/``: the model's HF config (rank 0), so :func:`merge_dcp_to_hf` needs no other source.

Follows ``torch.distributed.checkpoint.state_dict`` (``get_state_dict``/``set_state_dict``) as used by
torchtitan and ``verl/utils/checkpoint/fsdp_checkpoint_manager.py``. Reading never unpickles arbitrary objects: DCP's
metadata and non-tensor values go through :mod:`verl_fsdp.safe_dcp`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from verl.engines.safe_files import load_weights_only, save_weights_only
from verl_fsdp import safe_dcp

META_FILE = "verl_fsdp.json"
HF_CONFIG_DIR = "hf_config"
FORMAT = "verl-fsdp-dcp/1"


def _extra_file(folder: Path, world_size: int, rank: int) -> Path:
    return folder / f"extra_state_world_size_{world_size}_rank_{rank}.pt"


def save_dcp(engine: Any, folder: str | Path) -> None:
    """Write ``engine``'s model (+ optimizer, LR scheduler, counters) to ``folder``; collective over all ranks."""
    folder = Path(folder)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    options = _options(engine)
    if engine.trainable:
        model_sd, optim_sd = get_state_dict(engine.model, [engine.optimizer], options=options)
        state = {"model": adapter_only(engine, model_sd), "optimizer": optim_sd}
    else:
        state = {"model": get_model_state_dict(engine.model, options=options)}
    dcp.save(state, checkpoint_id=str(folder))
    extra: dict[str, Any] = {"global_step": engine.global_step, "skipped_steps": engine.skipped_steps}
    if engine.trainable:
        extra["lr_scheduler"] = engine.lr_scheduler.state_dict()
    save_weights_only(_extra_file(folder, world, rank), extra)
    if rank == 0:
        meta = {
            "format": FORMAT,
            "world_size": world,
            "mesh": list(engine.mesh.shape),
            "trainable": engine.trainable,
            "lora": bool(getattr(engine, "lora", False)),
        }
        (folder / META_FILE).write_text(json.dumps(meta, indent=2))
        engine.model.config.save_pretrained(str(folder / HF_CONFIG_DIR))
    dist.barrier()


def _options(engine: Any) -> StateDictOptions | None:
    """With LoRA only the adapter (and its optimizer state) is saved: the frozen base is the model folder."""
    state_options = getattr(engine, "state_options", None)
    return state_options() if state_options is not None else None


def adapter_only(engine: Any, model_sd: dict[str, Any]) -> dict[str, Any]:
    """With LoRA, only the adapter entries: ``ignore_frozen_params`` keeps a tied alias of a frozen weight
    (``lm_head.weight`` of a tied-embedding model), which is the model folder's, not training state."""
    if not getattr(engine, "lora", False):
        return model_sd
    names = set(engine.adapter_names())
    return {k: v for k, v in model_sd.items() if k in names}


def load_dcp(engine: Any, folder: str | Path) -> None:
    """Restore what :func:`save_dcp` wrote into ``engine`` (same world size); collective over all ranks.

    Raises:
        FileNotFoundError: ``folder`` has no ``verl_fsdp.json`` (not a verl-fsdp checkpoint).
        ValueError: the checkpoint was written by a different world size (LR/counter files are per rank),
            or without an optimizer while ``engine`` trains.
        CheckpointFileError: DCP metadata or a value that is not plain data (never unpickled), or a truncated /
            corrupt per-rank file (names it).
    """
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{folder} is not a verl-fsdp checkpoint: {META_FILE} is missing")
    meta = json.loads(meta_path.read_text())
    rank, world = dist.get_rank(), dist.get_world_size()
    if int(meta["world_size"]) != world:
        raise ValueError(
            f"checkpoint {folder} was saved by {meta['world_size']} ranks but this run has world_size={world}; "
            "resume with the same number of ranks, or take the weights with `verl export <global_step_N folder> <out>`"
        )
    if engine.trainable and not meta.get("trainable", False):
        raise ValueError(f"checkpoint {folder} holds no optimizer state (saved by a forward-only engine)")
    lora = bool(getattr(engine, "lora", False))
    if bool(meta.get("lora", False)) != lora:
        raise ValueError(
            f"checkpoint {folder} was saved with LoRA {'on' if meta.get('lora') else 'off'} but this engine has "
            f"LoRA {'on' if lora else 'off'}; resume with the model.lora_rank it was saved with"
        )
    options = _options(engine)
    if engine.trainable:
        model_sd, optim_sd = get_state_dict(engine.model, [engine.optimizer], options=options)
        state = {"model": adapter_only(engine, model_sd), "optimizer": optim_sd}
        safe_dcp.load(state, folder)
        set_state_dict(
            engine.model,
            [engine.optimizer],
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=options,
        )
    else:
        state = {"model": get_model_state_dict(engine.model, options=options)}
        safe_dcp.load(state, folder)
        set_model_state_dict(engine.model, state["model"], options=options)
    extra = load_weights_only(_extra_file(folder, world, rank))
    engine.global_step = int(extra["global_step"])
    engine.skipped_steps = int(extra["skipped_steps"])
    if engine.trainable:
        engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])


def full_state_dict_rank0(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict on rank 0 (empty dict elsewhere); collective over all ranks."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def write_hf_folder(config: Any, state_dict: dict[str, torch.Tensor], out_folder: str | Path) -> None:
    """Write ``state_dict`` (HF names) with HF ``config`` as a ``from_pretrained`` folder, without a second copy.

    The model skeleton is built on the meta device and the tensors are assigned into it; tied weights
    (``tie_word_embeddings``) are re-tied, so a state dict holding only one of them is complete.

    Raises:
        ValueError: a parameter of the architecture is missing from ``state_dict`` or a key is unknown.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"state dict does not match {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )
    model.config.use_cache = True
    model.save_pretrained(str(out_folder))


def merge_dcp_to_hf(
    dcp_folder: str | Path, hf_config_source: str | Path | None = None, out_folder: str | Path = "hf_export"
) -> Path:
    """Merge a sharded DCP checkpoint into one HF folder, in a single process (no process group).

    Args:
        dcp_folder: folder written by ``FSDPTrainingEngine.save_checkpoint`` (any world size).
        hf_config_source: HF folder (or hub id) whose ``config.json`` describes the model; ``None`` =
            the ``hf_config/`` the checkpoint carries. A tokenizer found there is copied too.
        out_folder: destination; gets ``config.json`` + ``model.safetensors`` (+ tokenizer files).

    Returns:
        ``Path(out_folder)``.

    Raises:
        FileNotFoundError: ``dcp_folder`` has no DCP ``.metadata``.
        ValueError: the checkpoint's model keys do not fit the config's architecture.
    """
    from transformers import AutoConfig

    dcp_folder, out_folder = Path(dcp_folder), Path(out_folder)
    if not (dcp_folder / ".metadata").is_file():
        raise FileNotFoundError(f"{dcp_folder} is not a torch.distributed.checkpoint folder (.metadata missing)")
    source = Path(hf_config_source) if hf_config_source is not None else dcp_folder / HF_CONFIG_DIR
    config = AutoConfig.from_pretrained(str(source))
    keys = safe_dcp.SafeFileSystemReader(str(dcp_folder)).read_metadata().state_dict_metadata
    model_keys = {k for k in keys if k.startswith("model.")}
    # Only the model entries are read: the optimizer state (2x the weights for AdamW) stays on disk.
    with warnings.catch_warnings():  # "no process group, loading in a single process" is the intent here
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        loaded = safe_dcp.load_keys(dcp_folder, model_keys)
    state = loaded["model"] if "model" in loaded and isinstance(loaded["model"], dict) else loaded
    state = {k.removeprefix("model.") if k in model_keys else k: v for k, v in state.items()}
    write_hf_folder(config, state, out_folder)
    _copy_tokenizer(source, out_folder)
    return out_folder


def _copy_tokenizer(source: Path, out_folder: Path) -> None:
    if not (source.is_dir() and any((source / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))):
        return
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out_folder))
