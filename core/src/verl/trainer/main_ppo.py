"""``python3 -m verl.trainer.main_ppo [Hydra overrides]``: verl's entry point, run as ``verl train``.

verl's run scripts call this module with Hydra overrides over verl's ``ppo_trainer`` config. Here the same
command line starts ``verl train`` from verl's defaults (``verl train --schema-defaults``, not the built-in CPU
run config that a bare ``verl train`` uses), after the translation :mod:`verl.cli.hydra_args` describes
(``+key``/``++key``, ``--config-path``/``--config-name``, ``hydra.run.dir``, ``hydra.searchpath``, the dropped
and refused Hydra settings). ``--cfg job`` prints the config as ``verl config show`` does instead of training.
Exit status as ``verl train``: 0 done, 2 config or set-up error, 1 run error, 130 / 143 stopped by SIGINT /
SIGTERM (the line ``stopped at step N; rerun to resume from ...``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

USAGE = """usage: python -m verl.trainer.main_ppo [--config-path DIR] [--config-name NAME] [--cfg job] [key=value ...]

verl's entry point, run as `verl train` starting from verl's defaults (ppo_trainer).
  key=value, +key=value, ++key=value   overrides (~key deletion is refused: set key=null)
  --config-path DIR, --config-name NAME
                      NAME.yaml in DIR is the config file (its defaults: list is composed); a relative
                      DIR starts at verl/trainer/, whose config/ holds the built-in configs: ppo_trainer
                      (the default), dapo_trainer (verl's DAPO recipe) and the shipped run configs
  --config-dir DIR    one more directory searched for config names
  hydra.run.dir=DIR   the run folder (as verl train --run-dir; checkpoints stay at trainer.default_local_dir)
  hydra.searchpath=[file://DIR,...]
                      directories searched for config names
  --cfg job           print the config (verl config show) instead of training
Hydra's logging settings are dropped with a note; launchers, sweeps (--multirun) and other hydra.* keys are
refused. See docs/verl-compat.md ("Running a verl script").
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Translate the Hydra command line and run ``verl train`` (or ``verl config show`` for ``--cfg job``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("--help", "-h") for a in argv):
        print(USAGE, end="")
        return 0
    from verl.cli.hydra_args import translate
    from verl.config import ConfigError

    try:
        run = translate(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    args = argparse.Namespace(
        items=([str(run.config_file)] if run.config_file is not None else []) + list(run.overrides),
        run_dir=run.run_dir,
        schema_defaults=False,
        # verl's own switch for its loggers' level; DEBUG also shows tracebacks, as verl train -v
        verbose=os.environ.get("VERL_LOGGING_LEVEL", "").upper() == "DEBUG",
        base=run.base,
        search_path=run.search_path,
        checkpoints_follow_run_dir=False,
    )
    if run.show:
        from verl.cli import config_cmd

        return int(config_cmd.run(args) or 0)
    from verl.cli import train_cmd

    return int(train_cmd.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
