"""Entry point of the ``verl`` command.

Each sub-command lives in its own module exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only
when their command runs, so ``verl --help`` stays fast and never imports torch.
Options may come anywhere among a command's arguments (:func:`parse_command_line`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# command name -> module path. Keep alphabetical.
COMMANDS: dict[str, str] = {
    "checkpoint": "verl.cli.checkpoint_cmd",
    "config": "verl.cli.config_cmd",
    "data": "verl.cli.data_cmd",
    "export": "verl.cli.export_cmd",
    "plugins": "verl.cli.plugins_cmd",
    "sft": "verl.cli.sft_cmd",
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


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv`` with options allowed anywhere among a command's positional arguments.

    ``verl train cfg.yaml --run-dir X key=val`` must mean what ``verl train --run-dir X cfg.yaml key=val``
    means. Plain ``parse_args`` stops filling a ``nargs="*"`` positional at the first option and rejects
    the rest, and ``parse_intermixed_args`` refuses parsers with sub-commands. So the leading sub-command
    words (``config``, ``show``) are walked here, each level's defaults set, and the innermost parser gets
    ``parse_intermixed_args``. Options before a sub-command word (``verl --version``) take the plain path.

    Raises:
        SystemExit: what argparse raises for ``--help`` and bad arguments (usage on stderr, status 2).
    """
    namespace = argparse.Namespace()
    rest = list(argv)
    current = parser
    while True:
        sub = _subcommands(current)
        if sub is None:
            return current.parse_intermixed_args(rest, namespace)
        if not rest or rest[0] not in sub.choices:
            return current.parse_args(rest, namespace)
        for action in current._actions:
            if action is not sub and action.default is not argparse.SUPPRESS:
                setattr(namespace, action.dest, action.default)
        for dest, value in current._defaults.items():  # set_defaults() of a level walked through
            setattr(namespace, dest, value)
        setattr(namespace, sub.dest, rest[0])
        current, rest = sub.choices[rest[0]], rest[1:]


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``verl`` command line; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(command if command in COMMANDS else None)
    args = parse_command_line(parser, argv)
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
