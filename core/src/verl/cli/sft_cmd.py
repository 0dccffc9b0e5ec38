"""``verl sft [CONFIG.yaml] [key=value ...]``: supervised fine-tuning (verl's ``sft_trainer``).

The config follows verl's ``sft_trainer_engine.yaml`` keys (``data.*``, ``model.*``, ``optim.*``,
``engine.*``, ``checkpoint.*``, ``trainer.*``; :mod:`verl.config.schema.sft`). The run folder is
``trainer.default_local_dir``: ``config.yaml``, ``metrics.jsonl`` (with ``trainer.logger`` including ``file``),
``global_step_N/`` checkpoints and the final HF folder ``final_hf/`` (loadable as ``actor_rollout_ref.model.path``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

HELP = "supervised fine-tuning on chat data (verl sft_trainer keys) from a YAML config and key=value overrides"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``[CONFIG] [key=value ...]`` and ``-v``, in any order."""
    parser.add_argument("items", nargs="*", metavar="ITEM", help="YAML file (optional, first), then key=value")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """``(config path or None, overrides)``: a first item without ``=`` is the config file."""
    if items and "=" not in items[0]:
        return items[0], list(items[1:])
    return None, list(items)


def _ensure_gsm8k_sft(files: list[str]) -> None:
    """Write the shipped GSM8K SFT rows when every missing data file lies in their default folder
    (``verl data gsm8k --sft``); any other missing file is left for the dataset to report."""
    from pathlib import Path

    from verl.data.gsm8k_sft import DEFAULT_SFT_DIR, prepare_gsm8k_sft

    folder = DEFAULT_SFT_DIR.expanduser()
    missing = [Path(f).expanduser() for f in files if not Path(f).expanduser().exists()]
    if missing and all(f.parent == folder for f in missing):
        print(f"verl sft: preparing GSM8K SFT rows in {folder} (verl data gsm8k --sft)", file=sys.stderr)
        prepare_gsm8k_sft(folder)


def _launch_ranks(cfg: Any, items: list[str]) -> int:
    """``trainer.n_gpus_per_node`` > 1 without torchrun: run this command as that many ranks of one node (torchrun's
    environment, as verl's SFT launch; the rendezvous on loopback); several nodes need torchrun on each. Returns the
    first failing rank's exit code."""
    from verl.models.resolve import resolve_model_path
    from verl.trainer.sft_ranks import launch_ranks

    t = cfg.trainer
    if t.nnodes > 1:
        print(
            f"verl sft: config error:\ntrainer.nnodes={t.nnodes}: start every node with torchrun --nnodes={t.nnodes} "
            f"--nproc_per_node={t.n_gpus_per_node} --rdzv_endpoint=<host:port> -m verl.trainer.sft_trainer ...",
            file=sys.stderr,
        )
        return 2
    if cfg.engine.strategy != "megatron":  # data parallel over every rank: check the batch split before launching
        from verl.config.errors import ConfigError
        from verl.trainer.sft_engine import check_world

        try:
            check_world(cfg, t.n_gpus_per_node)
        except ConfigError as exc:
            print(f"verl sft: config error:\n{exc}", file=sys.stderr)
            return 2
    resolve_model_path(cfg.model.path)  # a GGUF default model is converted once, here, not by every rank
    from verl.trainer.stops import StopSignals

    print(f"verl sft: starting {t.n_gpus_per_node} ranks of verl.trainer.sft_trainer on this node", file=sys.stderr)
    stops = StopSignals()  # SIGTERM to this launcher stops the ranks as Ctrl-C does (launch_ranks forwards it)
    stops.install()
    try:
        return launch_ranks(t.n_gpus_per_node, items)
    finally:
        stops.restore()


def _stop_hint(trainer: Any) -> str:
    """``stopped at step N; rerun to resume from <checkpoint>``: where the same command continues."""
    if trainer is None:
        return "stopped before training started"
    latest = trainer.checkpoints.latest() if trainer.checkpoints is not None else None
    if latest is None:
        return f"stopped at step {trainer.global_step}; rerun to resume: no checkpoint was saved yet, so it starts over"
    return f"stopped at step {trainer.global_step}; rerun to resume from {latest[1]} (step {latest[0]})"


def run(args: argparse.Namespace) -> int:
    from verl.config.errors import ConfigError
    from verl.config.sft_loader import load_sft_config
    from verl.data.sft_dataset import SFTRowError
    from verl.trainer.checkpoint import CheckpointError

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    path, overrides = split_items(list(args.items))
    try:
        cfg = load_sft_config(path, overrides)
    except ConfigError as exc:
        print(f"verl sft: config error:\n{exc}", file=sys.stderr)
        return 2
    _ensure_gsm8k_sft([*(cfg.data.train_files or ()), *(cfg.data.val_files or ())])
    t = cfg.trainer
    if t.nnodes * t.n_gpus_per_node > 1 and "WORLD_SIZE" not in os.environ:
        return _launch_ranks(cfg, [*args.items, *(["-v"] if args.verbose else [])])
    from verl.trainer.sft_ranks import leave_process_group
    from verl.trainer.sft_trainer import SFTTrainer
    from verl.trainer.stops import StopSignals, exit_status

    stops = StopSignals()
    stops.install()
    trainer = None
    try:
        trainer = SFTTrainer(cfg, stops=stops)
        metrics = trainer.fit()
    except ConfigError as exc:
        print(f"verl sft: config error:\n{exc}", file=sys.stderr)
        return 2
    except (SFTRowError, CheckpointError, FileNotFoundError) as exc:
        print(f"verl sft: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # SIGINT / SIGTERM (verl.trainer.stops): one line, no traceback
        signum = getattr(exc, "signum", signal.SIGINT)
        if trainer is None or trainer.world.is_main:
            print(f"verl sft: {signal.Signals(signum).name}: {_stop_hint(trainer)}", file=sys.stderr)
        return exit_status(signum)
    finally:
        stops.restore()
    leave_process_group(trainer.world)
    if not trainer.world.is_main:
        return 0
    print(f"verl sft: done ({trainer.global_step} steps); final model: {trainer.run_dir / 'final_hf'}")
    if metrics:
        print("verl sft: last metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
    return 0
