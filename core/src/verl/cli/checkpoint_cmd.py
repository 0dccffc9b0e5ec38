"""``verl checkpoint``: verify checkpoints, and convert ones of the old pickle format.

    verl checkpoint verify checkpoints/<project>/<experiment>                  # every global_step_N in it
    verl checkpoint convert checkpoints/<project>/<experiment>/global_step_20 --trust-pickle

``verify`` checks each folder's ``manifest.json`` (every file's size, then sha256) and prints its health; exit 1
when any fails. ``convert`` rewrites a checkpoint saved before checkpoints were data only (``data.pt``,
``trainer_state.pt``, ``model_world_size_*.pt``): it loads those pickles, which can run code, so it refuses without
``--trust-pickle``; see :mod:`verl.trainer.checkpoint_convert` (the old files are deleted once the new ones read back
equal, or kept beside with ``--keep-old``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = "verify checkpoints (manifest sizes and sha256), or convert old pickle checkpoints to the data-only format"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="check global_step_N folders against their manifest.json")
    verify.add_argument("paths", nargs="+", help="global_step_N folders, or folders holding them")
    convert = sub.add_parser("convert", help="rewrite old pickle checkpoints (data.pt, *.pt) as data files")
    convert.add_argument("paths", nargs="+", help="global_step_N folders, or folders holding them")
    convert.add_argument(
        "--trust-pickle",
        action="store_true",
        help="load the old pickle files (this runs any code they hold): only for checkpoints your own run wrote",
    )
    convert.add_argument(
        "--keep-old", action="store_true", help="keep the old folder as global_step_N.legacy-pickle (default: delete)"
    )


def _step_folders(path: Path) -> list[Path]:
    from verl.trainer.checkpoint_resume import STEP_DIR

    if STEP_DIR.match(path.name):
        return [path]
    found = [p for p in path.iterdir() if p.is_dir() and STEP_DIR.match(p.name)] if path.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.rsplit("_", 1)[1]))


def _verify(paths: list[str]) -> int:
    from verl.engines.safe_files import CheckpointFileError
    from verl.trainer.checkpoint_manifest import CheckpointHealth, verify_checkpoint

    failed = 0
    for given in paths:
        target = Path(os.path.expanduser(given))
        folders = _step_folders(target)
        if not folders:
            if not target.exists():
                reason = "does not exist"
            elif (target / "checkpoints").is_dir():  # a --run-dir folder: its checkpoints are one level down
                reason = f"no global_step_<N> folder here; the run's checkpoints are in {target / 'checkpoints'}"
            else:
                reason = "no global_step_<N> folder"
            print(f"error: {given}: {reason}", file=sys.stderr)
            failed += 1
        for folder in folders:
            try:
                manifest = verify_checkpoint(folder)
            except CheckpointFileError as exc:
                print(f"FAILED {folder}: {exc}")
                failed += 1
                continue
            files = manifest["files"]
            size = sum(entry["size"] for entry in files.values())
            health = CheckpointHealth.from_json(manifest.get("health"))
            state = "health unknown" if health is None else health.describe()
            print(f"ok {folder}: {len(files)} files, {size / 1e6:.1f} MB, {state}")
    return 1 if failed else 0


def _convert(args: argparse.Namespace) -> int:
    from verl.engines.safe_files import CheckpointError
    from verl.trainer.checkpoint_convert import convert_checkpoints

    code = 0
    for given in args.paths:
        try:
            results = convert_checkpoints(given, trust_pickle=args.trust_pickle, keep_old=args.keep_old)
        except (CheckpointError, ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 2 if not args.trust_pickle else 1
            continue
        for result in results:
            if not result.converted:
                print(f"verl checkpoint: {result.folder} is already in the data-only format (verified)")
                continue
            kept = f"; old files kept in {result.kept}" if result.kept else "; old pickle files deleted"
            print(f"verl checkpoint: converted {result.folder} ({', '.join(result.converted)}){kept}")
    return code


def run(args: argparse.Namespace) -> int:
    if args.checkpoint_command == "verify":
        return _verify(args.paths)
    return _convert(args)
