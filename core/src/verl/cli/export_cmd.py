"""``verl export``: turn an actor checkpoint into a HF model folder (verl's ``model_merger``).

    verl export checkpoints/<project>/<experiment>/global_step_20 out/hf_step20

Works for any world size and any training engine that provides ``merge_checkpoint`` (the
``reference`` engine, verl-fsdp's sharded DCP checkpoints, ...): the checkpoint's ``checkpoint.json``
names the engine, its ``huggingface/`` folder holds the config and tokenizer. The merge runs in
this one process, without a process group or accelerator.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

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


def _actor_folder(path: Path) -> Path:
    return path / "actor" if (path / "actor").is_dir() else path


def run(args: argparse.Namespace) -> int:
    from verl.plugins import get_plugin_manager

    folder = _actor_folder(Path(args.checkpoint).expanduser())
    if not folder.is_dir():
        print(f"error: checkpoint folder {folder} does not exist", file=sys.stderr)
        return 2
    info_file = folder / "checkpoint.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {}
    strategy = args.strategy or info.get("strategy")
    if strategy is None:
        print(
            f"error: {info_file} not found, so the engine that wrote {folder} is unknown; pass --strategy "
            "(e.g. --strategy reference or --strategy fsdp)",
            file=sys.stderr,
        )
        return 2
    hf_source = Path(args.hf_source).expanduser() if args.hf_source else folder / "huggingface"
    if not (hf_source / "config.json").is_file():
        print(f"error: no config.json in {hf_source}; pass --hf-source <HF model folder>", file=sys.stderr)
        return 2
    try:
        spec = get_plugin_manager().get("training_engine", strategy)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if spec.merge_checkpoint is None:
        print(f"error: training engine {strategy!r} does not support verl export", file=sys.stderr)
        return 2
    try:
        out = spec.merge_checkpoint(folder, hf_source, Path(args.out).expanduser())
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"verl export: {folder} ({strategy}, world size {info.get('world_size', '?')}) -> {out}")
    return 0
