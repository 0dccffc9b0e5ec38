"""Options anywhere among a command's positional arguments: ``verl train cfg.yaml --run-dir X key=val``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from verl.cli.main import _build_parser, main, parse_command_line


def _parse(argv: list[str]) -> argparse.Namespace:
    command = next((a for a in argv if not a.startswith("-")), None)
    return parse_command_line(_build_parser(command), argv)


# Every placement of the options among `cfg.yaml a=1 b=2`: each must equal the form that always worked
# (options first), which argparse parses without any intermixing.
TRAIN_ORDERS = [
    ["train", "cfg.yaml", "--run-dir", "X", "a=1", "b=2"],
    ["train", "cfg.yaml", "a=1", "--run-dir", "X", "b=2"],
    ["train", "cfg.yaml", "a=1", "b=2", "--run-dir", "X"],
    ["train", "cfg.yaml", "-v", "a=1", "--run-dir=X", "--schema-defaults", "b=2"],
]


@pytest.mark.parametrize("argv", TRAIN_ORDERS)
def test_train_options_anywhere(argv: list[str]) -> None:
    args = _parse(argv)
    assert args.items == ["cfg.yaml", "a=1", "b=2"]
    assert args.run_dir == "X"
    options = ["--run-dir", "X", *(["-v"] if "-v" in argv else [])]
    leading = _build_parser("train").parse_args(["train", *options, "cfg.yaml", "a=1", "b=2"])
    assert (args.items, args.run_dir, args.verbose) == (leading.items, leading.run_dir, leading.verbose)


def test_plain_argparse_rejects_what_we_accept() -> None:
    # Why parse_command_line exists: argparse's parse_args stops the nargs="*" list at the first option.
    with pytest.raises(SystemExit):
        _build_parser("train").parse_args(TRAIN_ORDERS[0])
    assert _parse(TRAIN_ORDERS[0]).items == ["cfg.yaml", "a=1", "b=2"]


def test_config_show_options_anywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_size: 16\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 8\n")
    common = ["actor_rollout_ref.rollout.n=4", "trainer.device=cpu"]
    assert main(["config", "show", "--run-dir", str(tmp_path / "r"), str(path), *common]) == 0
    first = capsys.readouterr().out
    assert main(["config", "show", str(path), common[0], "--run-dir", str(tmp_path / "r"), common[1]]) == 0
    assert capsys.readouterr().out == first
    assert f"default_local_dir: {tmp_path / 'r' / 'checkpoints'}" in first
    assert "    n: 4\n" in first


def test_unknown_option_is_still_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parse(["train", "a=1", "--bogus", "b=2"])
    assert info.value.code == 2
    assert "--bogus" in capsys.readouterr().err


def test_nested_commands_keep_their_defaults() -> None:
    args = _parse(["data", "gsm8k", "--skip-bad-rows", "--out", "o"])
    assert (args.command, args.dataset, args.out, args.skip_bad_rows) == ("data", "gsm8k", "o", True)
    assert args._data_parser.prog == "verl data"  # set_defaults() of the level walked through
    args = _parse(["export", "ckpt", "--strategy", "reference", "out"])
    assert (args.checkpoint, args.out, args.strategy) == ("ckpt", "out", "reference")
    assert _parse(["--version"]).version is True
