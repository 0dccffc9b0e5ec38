"""``verl export``: turn an actor checkpoint into a HF model folder (verl's ``model_merger``).

    verl export checkpoints/<project>/<experiment>/global_step_20 out/hf_step20

Works for any world size and any training engine that provides ``merge_checkpoint`` (the
``reference`` engine, verl-fsdp's sharded DCP checkpoints, ...): the checkpoint's ``checkpoint.json``
names the engine, its ``huggingface/`` folder holds the config and tokenizer. The merge runs in
this one process, without a process group or accelerator.

A LoRA checkpoint (``model.lora_rank > 0``) holds the adapter as a peft folder (``lora_adapter/``) and names its
base model in ``checkpoint.json``: by default the adapter is merged into the base (a plain HF folder), with
``--adapter`` the peft adapter folder itself is written (``PeftModel.from_pretrained(base, out)`` loads it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl.plugins.discovery import PluginInfo

HELP = "merge an actor checkpoint (any engine, any world size) into a HF model folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a global_step_N folder (or its actor/ subfolder)")
    parser.add_argument("out", help="destination HF folder (config.json, model.safetensors, tokenizer)")
    parser.add_argument(
        "--hf-source",
        default=None,
        help="HF folder with the model config + tokenizer (default: the checkpoint's huggingface/ folder)",
    )
    parser.add_argument(
        "--strategy", default=None, help="training engine that wrote it (default: read from checkpoint.json)"
    )
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA checkpoint: write the peft adapter folder instead of the merged model",
    )


def _actor_folder(path: Path) -> Path:
    return path / "actor" if (path / "actor").is_dir() else path


class ExportSetupError(ValueError):
    """The checkpoint cannot be exported as asked (missing folder, engine, config); the message says why."""


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    hf_source: str | Path | None = None,
    strategy: str | None = None,
    adapter: bool = False,
) -> tuple[Path, dict]:
    """Merge an actor checkpoint into the HF folder ``out``; returns ``(out, checkpoint.json contents)``.

    Args:
        checkpoint: a ``global_step_N`` folder or its ``actor/`` subfolder.
        out: destination folder.
        hf_source: HF folder with the config + tokenizer (default: the checkpoint's ``huggingface/``).
        strategy: training engine that wrote it (default: ``checkpoint.json``'s ``strategy``).
        adapter: LoRA checkpoint: copy its peft adapter folder instead of merging it (any other checkpoint: error).
            A LoRA merge loads the base model from ``hf_source`` when given, else from ``checkpoint.json``.

    Raises:
        ExportSetupError: no such folder, unknown engine, no config, or an engine without ``merge_checkpoint``.
        CheckpointFileError: the ``global_step_N`` folder's manifest does not verify (names the file), or the
            checkpoint is in the old pickle format (``LegacyCheckpointError``, names ``verl checkpoint convert``).
        FileNotFoundError / ValueError / RuntimeError: from the engine's merge (e.g. missing shard files).
    """
    from verl.plugins import get_plugin_manager
    from verl.trainer.checkpoint_manifest import MANIFEST_FILE, verify_checkpoint

    folder = _actor_folder(Path(checkpoint).expanduser())
    if not folder.is_dir():
        raise ExportSetupError(f"checkpoint folder {folder} does not exist")
    if (folder.parent / MANIFEST_FILE).is_file():  # exporting damaged weights would hand them on quietly
        verify_checkpoint(folder.parent)
    info_file = folder / "checkpoint.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    strategy = strategy or info.get("strategy")
    if strategy is None:
        raise ExportSetupError(
            f"{info_file} not found, so the engine that wrote {folder} is unknown; pass --strategy "
            "(e.g. --strategy reference or --strategy fsdp)"
        )
    if "lora" in info or adapter:
        return _export_lora(folder, info, Path(out).expanduser(), hf_source=hf_source, adapter=adapter)
    source = Path(hf_source).expanduser() if hf_source else folder / "huggingface"
    if not (source / "config.json").is_file():
        raise ExportSetupError(f"no config.json in {source}; pass --hf-source <HF model folder>")
    manager = get_plugin_manager()
    try:
        spec = manager.get("training_engine", strategy)
    except ValueError as exc:
        raise ExportSetupError(str(exc)) from exc
    if spec.merge_checkpoint is None:
        raise ExportSetupError(no_merge_message(strategy, manager.provider("training_engine", strategy)))
    return spec.merge_checkpoint(folder, source, Path(out).expanduser()), {"strategy": strategy, **info}


def _export_lora(
    folder: Path, info: dict, out: Path, *, hf_source: str | Path | None, adapter: bool
) -> tuple[Path, dict]:
    """The LoRA branch of :func:`export_checkpoint`: the adapter folder, or the base merged with it."""
    import shutil

    from verl.engines.lora import merge_adapter_folder
    from verl.engines.reference.export import copy_tokenizer

    if "lora" not in info:
        raise ExportSetupError(
            f"--adapter: {folder} holds no LoRA adapter (its checkpoint.json has no 'lora' entry: trained with "
            "actor_rollout_ref.model.lora_rank=0); export without --adapter"
        )
    adapter_dir = folder / info["lora"].get("adapter", "lora_adapter")
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ExportSetupError(f"LoRA checkpoint {folder}: no peft adapter in {adapter_dir}")
    if adapter:
        shutil.copytree(adapter_dir, out, dirs_exist_ok=True)
        return out, info
    base = Path(hf_source).expanduser() if hf_source else Path(str(info["lora"].get("base_model", "")))
    if not (base / "config.json").is_file():
        raise ExportSetupError(
            f"LoRA checkpoint {folder}: its base model {str(base)!r} is not a HF folder here; pass --hf-source "
            "<base model folder> (or --adapter for the adapter alone)"
        )
    merge_adapter_folder(base, adapter_dir, out)
    copy_tokenizer(folder / "huggingface" if (folder / "huggingface").is_dir() else base, out)
    return out, info


def no_merge_message(strategy: str, plugin: PluginInfo) -> str:
    """Why ``verl export`` refuses a checkpoint of engine ``strategy`` (provided by ``plugin``), and what to do.

    The spec lacks ``merge_checkpoint``; ``verl train`` still writes the final actor of a run as a HF folder with
    the engine's ``save_hf`` (``final_hf/``), the one HF copy such an engine gives today.
    """
    author = plugin.distribution or "the plugin"
    return (
        f"training engine {strategy!r} (plugin {plugin.describe()}) cannot export checkpoints: its "
        "TrainingEngineSpec has no merge_checkpoint (merge_checkpoint(actor_folder, hf_source, out_folder) -> Path, "
        "which turns an actor checkpoint of that engine into a HF folder in one process). `verl train` still "
        "writes a run's final actor as a HF folder, <run dir>/final_hf/, with the engine's save_hf; "
        f"to export this checkpoint, ask the authors of {author} to add merge_checkpoint to its TrainingEngineSpec "
        "(docs/plugin-authors.md, Engines)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        out, info = export_checkpoint(
            args.checkpoint, args.out, hf_source=args.hf_source, strategy=args.strategy, adapter=args.adapter
        )
    except ExportSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    folder = _actor_folder(Path(args.checkpoint).expanduser())
    print(f"verl export: {folder} ({info['strategy']}, world size {info.get('world_size', '?')}) -> {out}")
    return 0
