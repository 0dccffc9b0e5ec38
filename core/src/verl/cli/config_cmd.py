"""``verl config show [CONFIG] [key=value ...]``: print the resolved config as YAML.

The config is built exactly like ``verl train`` builds it (defaults <- CONFIG file <- dotted
overrides, then validation), so this is the way to check a config before a run. Exit status 0
with the YAML on stdout; 2 with the error message on stderr (unknown key with did-you-mean,
wrong type, failed validation rule), never a traceback. Warnings go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "show the resolved config (defaults <- YAML file <- key=value overrides) or why it is invalid"

# What `verl train` (and `verl config show`) use when no CONFIG file is given.
DEFAULT_RUN_CONFIG = Path(__file__).resolve().parent.parent / "trainer" / "config" / "gsm8k_grpo_smollm2_cpu.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``show`` action and its positional ``[CONFIG] [key=value ...]``."""
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show",
        help="print the resolved config as YAML",
        description="Print the resolved config as YAML. CONFIG is a YAML file (optional); "
        "overrides are verl/Hydra style: actor_rollout_ref.rollout.n=4 or +trainer.logger=[console,file].",
    )
    show.add_argument(
        "--schema-defaults",
        action="store_true",
        help="start from the bare schema defaults (verl's) instead of the embedded run config",
    )
    show.add_argument(
        "items",
        nargs="*",
        metavar="[CONFIG] [key=value ...]",
        help="optional YAML file, then dotted overrides",
    )


def split_items(items: list[str]) -> tuple[str | None, list[str]]:
    """``["run.yaml", "a.b=1"]`` -> ``("run.yaml", ["a.b=1"])``: a first item without ``=`` is the file."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, list(items)


def run(args: argparse.Namespace) -> int:
    """Print the resolved YAML (exit 0) or the config error on stderr (exit 2)."""
    from verl.config import ConfigError, load_config, to_yaml

    path, overrides = split_items(args.items)

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    try:
        base = path or (None if args.schema_defaults else DEFAULT_RUN_CONFIG)
        cfg = load_config(base, overrides, on_warning=warn)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(to_yaml(cfg))
    sys.stdout.write(resolved_summary(cfg))
    return 0


def resolved_summary(cfg: object) -> str:
    """YAML comment lines with what the config resolves to on this machine (so the output stays valid YAML).

    The platform (``trainer.device`` or the probes), the rollout's dtype (``auto`` -> float32 on CPU, bfloat16
    on accelerators), its placement and its tensor-parallel layout (replicas x ranks per replica).
    """
    from verl.config.placement import rollout_placement, rollout_world_size
    from verl.engines.dtypes import resolve_dtype

    rollout = cfg.actor_rollout_ref.rollout
    try:
        from verl.platform import resolve_platform

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
    return "".join(f"# {line}\n" for line in lines)
