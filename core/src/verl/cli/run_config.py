"""The config arguments ``verl train`` and ``verl config show`` share, and how they become a config.

``[CONFIG] [key=value ...]``, ``--run-dir`` and ``--schema-defaults`` mean the same in both commands, so
``verl config show`` prints exactly what ``verl train`` would run (checkpoint folder included).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from verl.config.base import DEFAULT_RUN_CONFIG_NAME, ConfigBase, named_base, schema_base

BASE_HELP = (
    "Base config: with no CONFIG, the built-in GRPO run config "
    f"({DEFAULT_RUN_CONFIG_NAME}); a CONFIG file names its base with a Hydra defaults list, as verl's do "
    f"(defaults: [ppo_trainer, _self_] = verl's defaults; defaults: [{DEFAULT_RUN_CONFIG_NAME}, _self_]); "
    "a file without one starts from verl's defaults (ppo_trainer: GAE with a critic, train_batch_size 1024). "
    "The base used is printed and recorded at the top of config.yaml."
)
RUN_DIR_HELP = (
    "run folder (default runs/<project>/<experiment>): config.yaml, metrics.jsonl, final_hf/; with --run-dir "
    "and trainer.default_local_dir unset, checkpoints go to <run-dir>/checkpoints and resume looks only there. "
    "A fresh run (no checkpoint to resume) moves an earlier run's outputs found there aside "
    "(metrics.jsonl -> metrics.<time>.jsonl, ...) instead of overwriting them."
)


def add_config_arguments(parser: argparse.ArgumentParser, *, items_help: str) -> None:
    """Register ``items`` (``[CONFIG] [key=value ...]``), ``--run-dir`` and ``--schema-defaults``.

    Options may come anywhere among the items (``verl.cli.main.parse_command_line``).
    """
    parser.add_argument("items", nargs="*", metavar="[CONFIG] [key=value ...]", help=items_help)
    parser.add_argument("--run-dir", default=None, help=RUN_DIR_HELP)
    parser.add_argument(
        "--schema-defaults",
        action="store_true",
        help="start from verl's bare schema defaults (ppo_trainer) whatever the CONFIG file's defaults list says",
    )


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """``["run.yaml", "a.b=1"]`` -> ``("run.yaml", ["a.b=1"])``: a first item without ``=`` is the file."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, list(items)


def choose_base(path: str | None, schema_defaults: bool) -> ConfigBase:
    """The base of a CLI run (see :mod:`verl.config.base` for the rule).

    Raises:
        ConfigError: the file cannot be read or its defaults list is refused.
    """
    from verl.config.loader import config_base

    if schema_defaults:
        return schema_base("--schema-defaults")
    if path is None:
        return named_base(DEFAULT_RUN_CONFIG_NAME, "no CONFIG file given")
    return config_base(
        path,
        schema_base(
            f"'{path}' has no defaults: list (add defaults: [{DEFAULT_RUN_CONFIG_NAME}, _self_] to start from it)"
        ),
    )


def load_run_config(
    args: argparse.Namespace, on_warning: Callable[[str], None], filled: dict[str, str] | None = None
) -> tuple[object, ConfigBase]:
    """``(RootConfig, base)`` from the parsed shared arguments, built as ``verl train`` builds it.

    ``filled`` gains the keys whose null got a value from the world size, and why (``load_config``'s).

    Raises:
        ConfigError: any config error (file, defaults list, unknown key, type, validation rule).
    """
    from verl.config import load_config

    path, overrides = split_items(args.items)
    base = choose_base(path, args.schema_defaults)
    run_dir = None if args.run_dir is None else Path(args.run_dir)
    cfg = load_config(path, overrides, base=base, run_dir=run_dir, on_warning=on_warning, filled=filled)
    return cfg, base
