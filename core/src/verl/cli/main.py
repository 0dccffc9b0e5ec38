"""Entry point of the ``verl`` command.

Each sub-command lives in its own module exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only
when their command runs, so ``verl --help`` stays fast and never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# command name -> module path. Keep alphabetical.
COMMANDS: dict[str, str] = {
    "config": "verl.cli.config_cmd",
    "data": "verl.cli.data_cmd",
    "export": "verl.cli.export_cmd",
    "plugins": "verl.cli.plugins_cmd",
    "train": "verl.cli.train_cmd",
}


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl", description="verl: RL post-training for LLMs.")
    parser.add_argument("--version", action="store_true", help="print the verl-core version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_path in COMMANDS.items():
        if name == command:
            module = importlib.import_module(module_path)
            module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
        else:
            # Only the chosen command's module is imported; the others get a bare parser for --help.
            sub.add_parser(name, help=_help_of(module_path), add_help=False)
    return parser


def _help_of(module_path: str) -> str:
    try:
        return importlib.import_module(module_path).HELP
    except Exception as exc:  # a broken command must not break `verl --help`
        return f"(unavailable: {exc})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``verl`` command line; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.version:
        from verl import __version__

        print(f"verl-core {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:
        # `verl plugins | head` closed the pipe: not an error of ours. Silence the flush at exit too.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
