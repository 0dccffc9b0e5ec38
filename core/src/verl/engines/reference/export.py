"""``verl export`` for the reference engine: an actor checkpoint folder -> a HF model folder.

The reference engine checkpoints its state dict as :mod:`verl.engines.reference.checkpoint_files` (one process:
``model_world_size_1_rank_0.safetensors`` holds the model, the optimizer and counters sit beside it). Only the model
is read (no pickle is loaded) and written as ``model.safetensors`` next to the config (and tokenizer) from
``hf_source``. A checkpoint of the old pickle format is refused with the command that converts it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The model file of a reference-engine checkpoint (world size 1).
CHECKPOINT_FILE = "model_world_size_1_rank_0.safetensors"


def copy_tokenizer(source: Path, out_folder: Path) -> bool:
    """Copy the tokenizer found in ``source`` (a HF folder) to ``out_folder``; False if there is none."""
    if not any((source / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return False
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(source)).save_pretrained(str(out_folder))
    return True


def merge_reference_checkpoint(actor_folder: str | Path, hf_source: str | Path, out_folder: str | Path) -> Path:
    """Write the model weights of a reference-engine actor checkpoint as a HF folder.

    Args:
        actor_folder: ``global_step_N/actor`` written by the reference engine (world size 1).
        hf_source: HF folder with the model's ``config.json`` (and tokenizer, copied when present).
        out_folder: destination (created); gets ``config.json``, ``model.safetensors`` (+ tokenizer).

    Returns:
        ``Path(out_folder)``.

    Raises:
        LegacyCheckpointError: the folder holds the old pickle format (names ``verl checkpoint convert``).
        FileNotFoundError: no ``model_world_size_1_rank_0.safetensors`` in ``actor_folder``.
        CheckpointFileError: the file is truncated or corrupt (names it).
        RuntimeError: the checkpoint's tensors do not fit the config's architecture (from
            ``load_state_dict(strict=True)``).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.engines.reference.checkpoint_files import legacy_files
    from verl.engines.safe_files import LegacyCheckpointError, load_tensors

    actor_folder, hf_source, out_folder = Path(actor_folder), Path(hf_source), Path(out_folder)
    file = actor_folder / CHECKPOINT_FILE
    if not file.is_file():
        legacy = legacy_files(actor_folder)
        if legacy:
            raise LegacyCheckpointError(legacy[0])
        found = sorted(p.name for p in actor_folder.glob("model_world_size_*_rank_*"))
        raise FileNotFoundError(
            f"{file} not found; the reference engine writes one model file (world size 1)"
            + (f", this folder has {found}" if found else "")
        )
    weights: Any = load_tensors(file)
    config = AutoConfig.from_pretrained(str(hf_source))
    model = AutoModelForCausalLM.from_config(config, dtype=next(iter(weights.values())).dtype)
    model.load_state_dict(weights, strict=True)
    model.config.use_cache = True
    out_folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_folder))
    copy_tokenizer(hf_source, out_folder)
    return out_folder


def write_export_info(
    folder: str | Path,
    *,
    model_path: str | Path,
    tokenizer: Any,
    strategy: str,
    world_size: int,
    lora: bool = False,
    trust_remote_code: bool = False,
    override_config: Any = None,
) -> None:
    """What ``verl export`` reads beside an actor checkpoint's engine files (rank 0 writes it).

    ``folder/huggingface/``: the HF config the actor was built from (``override_config`` applied) and the tokenizer;
    ``folder/checkpoint.json``: ``{"strategy", "world_size"}`` and, with LoRA, ``{"lora": {"adapter": "lora_adapter",
    "base_model": model_path}}`` (the adapter folder itself is the engine's ``save_adapter`` output).

    Raises:
        TypeError, ValueError: a bad ``override_config`` or an unloadable ``model_path`` config
            (:func:`~verl.models.hf_config.load_hf_config`).
        OSError: ``folder`` cannot be written.
    """
    import json

    from verl.models.hf_config import load_hf_config

    folder = Path(folder)
    hf = folder / "huggingface"
    load_hf_config(model_path, trust_remote_code=trust_remote_code, override_config=override_config).save_pretrained(
        str(hf)
    )
    if tokenizer is not None:
        tokenizer.save_pretrained(str(hf))
    info: dict[str, Any] = {"strategy": strategy, "world_size": int(world_size)}
    if lora:
        from verl.engines.lora import ADAPTER_DIR

        info["lora"] = {"adapter": ADAPTER_DIR, "base_model": str(model_path)}
    (folder / "checkpoint.json").write_text(json.dumps(info, indent=2) + "\n")
