"""``verl data``: prepare datasets in verl's parquet format.

``verl data gsm8k [--out DIR] [--source DIR] [--skip-bad-rows] [--tools [NAME]]`` converts the GSM8K copy shipped
with verl-core (or the jsonl files in ``--source``) to ``DIR/train.parquet`` and ``DIR/test.parquet``.
The default ``DIR`` is ``~/data/gsm8k``, verl's own default, so verl-style overrides such as
``data.train_files=$HOME/data/gsm8k/train.parquet`` work unchanged. ``--tools`` (``code_interpreter`` when given
without a name, or ``calc_gsm8k_reward``) writes verl's multi-turn tool rows instead (:mod:`verl.data.gsm8k_tools`),
by default to ``~/data/gsm8k_tool_<NAME>``. ``--sft`` writes SFT rows (:mod:`verl.data.gsm8k_sft`), by default to
``~/data/gsm8k_sft``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl.data.gsm8k_tools import DEFAULT_TOOL, TOOLS, default_out_dir

HELP = "prepare datasets in verl's parquet format (gsm8k)"

DEFAULT_GSM8K_OUT = str(default_out_dir(None))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dataset", metavar="DATASET")
    gsm8k = sub.add_parser(
        "gsm8k",
        help="GSM8K (7473 train / 1319 test, MIT) -> train.parquet, test.parquet",
        description="Write GSM8K as verl parquet (data_source, prompt, ability, reward_model, extra_info).",
    )
    gsm8k.add_argument(
        "--out",
        default=None,
        help=f"output folder (default: {DEFAULT_GSM8K_OUT}, as in verl; with --tools NAME: "
        f"{default_out_dir(DEFAULT_TOOL).parent}/gsm8k_tool_NAME)",
    )
    gsm8k.add_argument(
        "--source",
        default=None,
        help="folder with train.jsonl[.gz] and test.jsonl[.gz] (default: the copy shipped with verl-core)",
    )
    gsm8k.add_argument("--skip-bad-rows", action="store_true", help="drop malformed rows instead of failing")
    gsm8k.add_argument(
        "--tools",
        nargs="?",
        const=DEFAULT_TOOL,
        default=None,
        choices=TOOLS,
        metavar="NAME",
        help=f"write verl's multi-turn tool rows (agent_name tool_agent, a system prompt offering the tool, "
        f"extra_info.tools_kwargs / interaction_kwargs) for rollout.mode=async; NAME: {' or '.join(TOOLS)} "
        f"(default {DEFAULT_TOOL})",
    )
    gsm8k.add_argument(
        "--sft",
        action="store_true",
        help="write SFT rows instead (messages: question -> worked solution ending in '#### answer', plus question/"
        "answer strings), by default to ~/data/gsm8k_sft (verl's folder), for `verl sft`",
    )
    parser.set_defaults(_data_parser=parser)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "dataset", None) != "gsm8k":
        args._data_parser.print_help(sys.stderr)
        return 2

    import pyarrow.parquet as pq

    from verl.data.gsm8k import prepare_gsm8k

    if getattr(args, "sft", False) and args.tools is not None:
        print("verl data gsm8k: error: --sft and --tools are separate formats; pass one", file=sys.stderr)
        return 2
    if getattr(args, "sft", False):
        from verl.data.gsm8k_sft import DEFAULT_SFT_DIR, prepare_gsm8k_sft

        out = Path(args.out) if args.out is not None else DEFAULT_SFT_DIR.expanduser()
    else:
        out = Path(args.out) if args.out is not None else default_out_dir(args.tools)
    try:
        if getattr(args, "sft", False):
            paths = prepare_gsm8k_sft(out, args.source, skip_bad_rows=args.skip_bad_rows)
        else:
            paths = prepare_gsm8k(out, args.source, skip_bad_rows=args.skip_bad_rows, tool=args.tools)
    except (OSError, ValueError) as exc:
        print(f"verl data gsm8k: error: {exc}", file=sys.stderr)
        return 1
    for split, path in paths.items():
        print(f"{split}: {path} ({pq.ParquetFile(path).metadata.num_rows} rows)")
    return 0
