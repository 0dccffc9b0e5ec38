"""The config arguments ``verl train`` and ``verl config show`` share, and how they become a config.

``[CONFIG] [key=value ...]``, ``--run-dir`` and ``--schema-defaults`` mean the same in both commands, so
``verl config show`` prints exactly what ``verl train`` would run (checkpoint folder included).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from verl.config.base import DEFAULT_RUN_CONFIG_NAME, SCHEMA_BASE_NAME, ConfigBase, named_base, schema_base

#: python -m verl.trainer.main_ppo, the other way to start from verl's defaults (named in notes).
MAIN_PPO = "python -m verl.trainer.main_ppo"

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
        "--config-name",
        "-cn",
        default=None,
        metavar="NAME",
        help="start from the built-in config NAME instead of a CONFIG file (Hydra's flag, as verl's entry points "
        f"take it): {SCHEMA_BASE_NAME} (verl's defaults), dapo_trainer (verl's DAPO recipe) or a shipped run config",
    )
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


def choose_base(path: str | None, schema_defaults: bool, search_path: Sequence[str | Path] = ()) -> ConfigBase:
    """The base of a CLI run (see :mod:`verl.config.base` for the rule), with the files a CONFIG composes.

    Raises:
        ConfigError: the file cannot be read or its defaults list is refused.
    """
    from verl.config.loader import config_base

    if schema_defaults:
        forced = schema_base("--schema-defaults")
        if path is None:
            return forced
        from verl.config.compose import compose

        return compose(path, search_path=search_path, forced_base=forced).base
    if path is None:
        return named_base(DEFAULT_RUN_CONFIG_NAME, "no CONFIG file given")
    return config_base(
        path,
        schema_base(
            f"'{path}' has no defaults: list (add defaults: [{DEFAULT_RUN_CONFIG_NAME}, _self_] to start from it)"
        ),
        search_path=search_path,
    )


def load_run_config(
    args: argparse.Namespace, on_warning: Callable[[str], None], filled: dict[str, str] | None = None
) -> tuple[object, ConfigBase]:
    """``(RootConfig, base)`` from the parsed shared arguments, built as ``verl train`` builds it.

    ``filled`` gains the keys whose null got a value from the world size, and why (``load_config``'s).
    ``python -m verl.trainer.main_ppo`` (:mod:`verl.cli.hydra_args`) also sets ``args.base`` (the config its
    ``--config-name`` names), ``args.search_path`` (``hydra.searchpath``) and ``args.checkpoints_follow_run_dir``
    (``False`` for ``hydra.run.dir``: verl keeps checkpoints at ``trainer.default_local_dir`` whatever
    Hydra's output folder). With no CONFIG file, the built-in CPU run config as base and overrides that look
    like a verl script's (:func:`verl_script_signs`), or a config error, one note on stderr says where the
    overrides went and how to start from verl's defaults instead.

    Raises:
        ConfigError: any config error (file, defaults list, unknown key, type, validation rule).
    """
    from verl.config import ConfigError, load_config

    path, overrides = split_items(args.items)
    search_path = tuple(getattr(args, "search_path", ()) or ())
    forced = getattr(args, "base", None) or config_name_base(args, path)
    base = forced or choose_base(path, args.schema_defaults, search_path)
    run_dir = None if args.run_dir is None else Path(args.run_dir)
    if not getattr(args, "checkpoints_follow_run_dir", True):
        run_dir = None
    over_builtin = path is None and forced is None and base.path is not None
    signs = verl_script_signs(overrides) if over_builtin else []
    try:
        cfg = load_config(
            path,
            overrides,
            base=None if path is not None and forced is None and not args.schema_defaults else base,
            search_path=search_path,
            run_dir=run_dir,
            on_warning=on_warning,
            filled=filled,
        )
    except ConfigError:
        if over_builtin and overrides:
            print(builtin_base_note(base, signs), file=sys.stderr)
        raise
    if signs:
        print(builtin_base_note(base, signs), file=sys.stderr)
    return cfg, base


def config_name_base(args: argparse.Namespace, path: str | None) -> ConfigBase | None:
    """The built-in config ``--config-name NAME`` names (``.yaml`` optional), None without the flag.

    Raises:
        ConfigError: (key ``--config-name``) an unknown name, listing the built-in ones; the flag together with
            a CONFIG file (Hydra's ``--config-name`` *is* the primary config: give one of them; a file starts
            from a built-in with ``defaults: [NAME, _self_]``) or with ``--schema-defaults``.
    """
    from verl.config import ConfigError

    name = getattr(args, "config_name", None)
    if name is None:
        return None
    key = f"--config-name={name}"
    if path is not None:
        raise ConfigError(
            f"{key} and the CONFIG file '{path}' both name the config to start from: give one (a file starts from "
            f"a built-in config with a defaults list: defaults: [{name.removesuffix('.yaml')}, _self_])",
            key="--config-name",
        )
    if args.schema_defaults:
        raise ConfigError(
            f"{key} and --schema-defaults both name the base: give one (--schema-defaults = "
            f"--config-name={SCHEMA_BASE_NAME})",
            key="--config-name",
        )
    return named_base(name, key, key="--config-name")


#: ``trainer.device`` values verl's own scripts use (verl has no cpu trainer and no vendor platforms).
VERL_SCRIPT_DEVICES = ("cuda", "npu")


def verl_script_signs(overrides: Sequence[str]) -> list[str]:
    """The overrides that suggest a verl run script (written for verl's ``ppo_trainer`` defaults).

    ``trainer.n_gpus_per_node`` or ``trainer.nnodes`` above 1, ``trainer.device`` set to one of verl's own device
    names (``cuda``, ``npu``; ``cpu`` or a vendor platform's name is this product's use, not a script's), any
    ``trainer.total_epochs``,
    a ``rollout.name`` other than ``hf``; ``+``/``++`` prefixes are looked through. Unparsable ones are skipped
    (the loader reports them).
    """
    from verl.config import ConfigError
    from verl.config.overrides import parse_override

    signs: list[str] = []
    for text in overrides:
        try:
            override = parse_override(text)
        except ConfigError:
            continue
        key, value = override.key, override.value
        if key in ("trainer.n_gpus_per_node", "trainer.nnodes"):
            sign = isinstance(value, int) and not isinstance(value, bool) and value > 1
        elif key == "trainer.device":
            sign = value in VERL_SCRIPT_DEVICES
        elif key == "trainer.total_epochs":
            sign = True
        else:
            sign = key == "actor_rollout_ref.rollout.name" and value != "hf"
        if sign:
            signs.append(text)
    return signs


def builtin_base_note(base: ConfigBase, signs: Sequence[str] = ()) -> str:
    """The note printed when overrides were applied over a built-in run config with no CONFIG file."""
    from verl.config.loader import read_yaml_file

    tree = read_yaml_file(base.path) if base.path is not None else {}
    trainer = tree.get("trainer") or {}
    actor = (tree.get("actor_rollout_ref") or {}).get("actor") or {}
    traits = [f"trainer.device={trainer.get('device')}"] if "device" in trainer else []
    if "total_training_steps" in trainer:
        traits.append(f"trainer.total_training_steps={trainer['total_training_steps']}")
    if actor.get("use_dynamic_bsz"):
        traits.append("dynamic batch sizes")
    verb = "looks" if len(signs) == 1 else "look"
    which = f" ({', '.join(signs)} {verb} like a verl script's)" if signs else ""
    return (
        f"note: the overrides{which} were applied over the built-in CPU run config {base.name} "
        f"({', '.join(traits) or base.path}), which is what verl train runs with no CONFIG file; for verl's "
        f"defaults (what verl's scripts assume) add --schema-defaults or use {MAIN_PPO}"
    )
