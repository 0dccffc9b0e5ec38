"""``verl config show [CONFIG] [key=value ...]``: print the resolved config as YAML.

The config is built exactly like ``verl train`` builds it (base <- CONFIG file <- dotted
overrides, then validation; same ``--run-dir`` and ``--schema-defaults``), so this is the way to check a
config before a run. The first line names the base config used (a YAML comment). Exit status 0
with the YAML on stdout; 2 with the error message on stderr (unknown key with did-you-mean,
wrong type, failed validation rule), never a traceback. Warnings go to stderr.
"""

from __future__ import annotations

import argparse
import sys

from verl.cli.run_config import BASE_HELP, add_config_arguments, load_run_config, split_items
from verl.config.base import DEFAULT_RUN_CONFIG_NAME, RUN_CONFIG_DIR

__all__ = ["DEFAULT_RUN_CONFIG", "add_arguments", "resolved_summary", "run", "split_items"]

HELP = "show the resolved config (base <- YAML file <- key=value overrides) or why it is invalid"

# What `verl train` (and `verl config show`) use when no CONFIG file is given.
DEFAULT_RUN_CONFIG = RUN_CONFIG_DIR / f"{DEFAULT_RUN_CONFIG_NAME}.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``show`` action and its ``[CONFIG] [key=value ...]``, ``--run-dir``, ``--schema-defaults``."""
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="print the resolved config as YAML",
        description="Print the resolved config as YAML, built exactly as verl train builds it. CONFIG is a YAML "
        "file (optional); overrides are verl/Hydra style: actor_rollout_ref.rollout.n=4 or "
        "+trainer.logger=[console,file]; options may come anywhere. " + BASE_HELP,
    )
    add_config_arguments(show, items_help="optional YAML file, then dotted overrides")


def run(args: argparse.Namespace) -> int:
    """Print the base line and the resolved YAML (exit 0) or the config error on stderr (exit 2)."""
    from verl.config import ConfigError, to_yaml

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    filled: dict[str, str] = {}
    try:
        cfg, base = load_run_config(args, warn, filled)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(f"# {base.describe()}\n")
    sys.stdout.write(to_yaml(cfg))
    sys.stdout.write(resolved_summary(cfg, filled))
    return 0


def resolved_summary(cfg: object, filled: dict[str, str] | None = None) -> str:
    """YAML comment lines with what the config resolves to on this machine (so the output stays valid YAML).

    The platform (``trainer.device`` or the probes), the rollout's dtype (``auto`` -> float32 on CPU, bfloat16
    on accelerators), its placement and its tensor-parallel layout (replicas x ranks per replica). ``filled``
    (from ``load_config``): the strategies and controller that were null, their value and why.
    """
    from verl.config.placement import rollout_placement, rollout_world_size
    from verl.engines.dtypes import resolve_dtype

    rollout = cfg.actor_rollout_ref.rollout
    try:
        from verl.plugins import resolve_platform

        platform = resolve_platform(cfg.trainer.device)
        device, where = platform.device_type, f"platform {platform.name}"
    except Exception as exc:  # an unavailable device is reported, not raised: show must still print the config
        device, where = "cpu", f"platform unresolved ({exc}); assuming cpu"
    dtype = str(resolve_dtype(rollout.dtype, device, field="actor_rollout_ref.rollout.dtype")).removeprefix("torch.")
    world, tp = rollout_world_size(cfg), int(rollout.tensor_model_parallel_size)
    # The hf rollout generates from the reference trainer's own module (one copy of the weights): its dtype is
    # the trainer's then, whatever rollout.dtype says.
    shared = rollout.name == "hf" and cfg.actor_rollout_ref.actor.strategy == "reference" and tp == 1
    dtype_line = (
        f"  actor_rollout_ref.rollout.dtype: the trainer's (the hf rollout shares its module; {rollout.dtype!r} "
        f"would be {dtype})"
        if shared
        else f"  actor_rollout_ref.rollout.dtype: {dtype}  # from {rollout.dtype!r}"
    )
    lines = [
        f"resolved on this machine ({where}):",
        dtype_line,
        f"  actor_rollout_ref.rollout.placement: {rollout_placement(cfg)}",
        f"  rollout world: {world} ranks = {max(world // max(tp, 1), 1)} replicas x tensor_model_parallel_size {tp}",
    ]
    from verl.config.resolve import get_path

    lines += [f"  {key}: {get_path(cfg, key)}  ({why})" for key, why in (filled or {}).items()]
    return "".join(f"# {line}\n" for line in lines)
