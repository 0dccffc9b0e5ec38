"""``verl train [CONFIG.yaml] [key=value ...] [--run-dir DIR]``: run RL post-training.

With no CONFIG, runs the embedded default ``gsm8k_grpo_smollm2_cpu.yaml`` (GRPO on GSM8K
with SmolLM2-135M-Instruct on CPU); a CONFIG file names its base with a Hydra ``defaults:`` list
(:mod:`verl.config.base`), and the base used is printed. The run directory (``--run-dir``, default
``runs/<project_name>/<experiment_name>``) receives the resolved ``config.yaml``,
``metrics.jsonl`` and the final actor as a HF folder (``final_hf/``); checkpoints go to
``trainer.default_local_dir``: ``<run-dir>/checkpoints`` when ``--run-dir`` is given and the key is
unset, else verl's default ``checkpoints/<project_name>/<experiment_name>`` (:mod:`verl.config.run_dir`).
A run that starts from scratch renames an earlier run's outputs aside first (:mod:`verl.trainer.earlier_run`);
one that resumes with other settings keeps the earlier ``config.yaml`` as ``config.<stamp>.yaml``.

Exit status: 0 done (or already finished), 1 run error, 2 config or set-up error, 130 / 143 stopped by SIGINT
(Ctrl-C) / SIGTERM (``128 + signal``, the shell's convention) with the line ``stopped at step N; rerun to resume
from <checkpoint>`` and no traceback (:mod:`verl.trainer.stops`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

HELP = "run RL post-training (GRPO/PPO-style) from a YAML config and key=value overrides"

GSM8K_DEFAULT_DIR = Path("~/data/gsm8k")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``[CONFIG] [key=value ...]`` plus ``--run-dir``, ``--schema-defaults`` and ``-v``, in any order."""
    from verl.cli.run_config import BASE_HELP, add_config_arguments

    parser.description = f"{HELP}. Options may come anywhere among the arguments. {BASE_HELP}"
    add_config_arguments(parser, items_help="YAML file, then overrides")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _expand(files: tuple[str, ...] | list[str] | None) -> list[str] | None:
    return None if files is None else [str(Path(f).expanduser()) for f in files]


def _gsm8k_default_dirs() -> dict[Path, str | None]:
    """``{expanded folder: tool}`` of the folders ``verl data gsm8k [--tools NAME]`` writes by default."""
    from verl.data.gsm8k_tools import TOOLS, default_out_dir

    dirs: dict[Path, str | None] = {GSM8K_DEFAULT_DIR.expanduser(): None}
    dirs.update({default_out_dir(tool).expanduser(): tool for tool in TOOLS})
    return dirs


def _ensure_gsm8k(files: list[str]) -> None:
    """Write the shipped GSM8K parquet files when the config points at their default folders.

    A missing file in ``~/data/gsm8k`` gets the plain rows (``verl data gsm8k``), one in ``~/data/gsm8k_tool_<NAME>``
    the multi-turn rows offering that tool (``verl data gsm8k --tools NAME``). Only when every missing file lies in
    one of those folders: any other missing file is left for the dataset to report.
    """
    missing = [Path(f) for f in files if not Path(f).exists()]
    defaults = _gsm8k_default_dirs()
    if not missing or any(f.parent not in defaults for f in missing):
        return
    from verl.data.gsm8k import prepare_gsm8k

    for folder in dict.fromkeys(f.parent for f in missing):
        tool = defaults[folder]
        command = "verl data gsm8k" + ("" if tool is None else f" --tools {tool}")
        print(f"verl train: preparing GSM8K parquet files in {folder} ({command})", file=sys.stderr)
        prepare_gsm8k(folder, tool=tool)


def _already_finished(cfg, run_dir: Path) -> Path | None:
    """With a fixed step count and ``resume_mode=auto``, a finished run is known from the tracker file and
    ``metrics.jsonl``: say so without loading data, model or checkpoint; returns its last checkpoint.

    Finished = the last step's checkpoint exists and verifies (its manifest), and, with the ``file`` logger, that
    step's row holds its validation (``timing_s/testing``) when one was due. Otherwise ``None``: the trainer resumes and runs what is
    missing (:meth:`verl.trainer.ppo_trainer.PPOTrainer.fit`).
    """
    total = cfg.trainer.total_training_steps
    if not total or cfg.trainer.resume_mode != "auto":
        return None
    from verl.trainer.checkpoint import CheckpointManager

    latest = CheckpointManager(cfg.trainer.default_local_dir).latest()
    if latest is None or latest[0] < total:
        return None
    from verl.trainer.checkpoint import CheckpointError
    from verl.trainer.checkpoint_manifest import verify_checkpoint

    try:  # a damaged or old-format last checkpoint is no finished run: the trainer's resume reports or skips it
        verify_checkpoint(latest[1])
    except CheckpointError:
        return None
    if "file" in cfg.trainer.logger and cfg.data.val_files and cfg.trainer.test_freq > 0:
        from verl.trainer.trackers.file_backend import METRICS_FILE, read_rows

        row = next((r for r in reversed(read_rows(run_dir / METRICS_FILE)) if r["step"] == latest[0]), None)
        if row is None or "timing_s/testing" not in row:
            return None  # the final validation did not finish: the trainer runs it
    print(f"verl train: already finished ({latest[0]}/{total} steps in {latest[1]}); nothing to do")
    return latest[1]


def _keep_earlier_run(run_dir: Path, cfg) -> int:
    """Before a from-scratch run writes anything, rename an earlier run's outputs aside and say so.

    Returns 0, or 2 after printing the error for a bad ``resume_mode`` / ``resume_from_path``."""
    from verl.trainer.checkpoint import CheckpointResumeError
    from verl.trainer.earlier_run import set_aside_earlier_run

    try:
        moved = set_aside_earlier_run(run_dir, cfg)
    except CheckpointResumeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if moved:
        print(
            f"verl train: {run_dir} holds an earlier run and this one starts from scratch (no checkpoint to "
            f"resume under {cfg.trainer.default_local_dir}); its outputs were kept, renamed:"
        )
        for old, new in moved:
            print(f"  {old} -> {new}")
    return 0


def _save_config(cfg, run_dir: Path, header: str) -> None:
    """Write the resolved ``config.yaml``; an earlier one with other settings (a resume with changed overrides)
    is renamed to ``config.<stamp>.yaml`` first (:func:`verl.trainer.earlier_run.keep_changed_config`)."""
    from verl.config import save_resolved_config
    from verl.trainer.earlier_run import keep_changed_config

    kept = keep_changed_config(run_dir, cfg)
    if kept is not None:
        print(f"verl train: the settings differ from the earlier {run_dir / 'config.yaml'}; kept it as {kept}")
    save_resolved_config(cfg, run_dir, header=header)


def _write_final_hf(run_dir: Path, write: Callable[[str], object]) -> Path:
    """``write(folder)`` into a temp folder renamed to ``final_hf/``: a ``final_hf`` present is always complete."""
    final = run_dir / "final_hf"
    for stale in run_dir.glob("final_hf.tmp-*"):  # left by a process killed while exporting
        shutil.rmtree(stale, ignore_errors=True)
    tmp = run_dir / f"final_hf.tmp-{os.getpid()}"
    try:
        write(str(tmp))
    except BaseException:  # a failed or interrupted export leaves nothing half-written behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    return final


def _export_if_missing(checkpoint: Path, run_dir: Path) -> int:
    """A finished run whose process stopped before writing ``final_hf/`` (killed after its last checkpoint):
    export it now from that checkpoint, as ``verl export`` does. Returns the exit status."""
    if (run_dir / "final_hf").is_dir():
        return 0
    from verl.cli.export_cmd import export_checkpoint

    try:
        final = _write_final_hf(run_dir, lambda out: export_checkpoint(checkpoint, out))
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"verl train: final actor (HF folder) was missing; exported {checkpoint} to {final}")
    return 0


def _latest_checkpoint(cfg, trainer) -> tuple[int, Path] | None:
    """The checkpoint a rerun would resume from (``None``: none yet), without creating the folder."""
    manager = getattr(trainer, "checkpoints", None)
    if manager is None:
        from verl.trainer.checkpoint import CheckpointManager

        root = Path(cfg.trainer.default_local_dir).expanduser()
        if not root.is_dir():
            return None
        manager = CheckpointManager(root)
    return manager.latest()


def _resume_hint(cfg, trainer) -> str:
    """``stopped at step N; rerun to resume ...``: the step reached and where a rerun continues from."""
    step = trainer.global_steps if trainer is not None else 0
    latest = _latest_checkpoint(cfg, trainer)
    if latest is None:
        return f"stopped at step {step}; rerun to resume: no checkpoint was saved yet, so it starts from scratch"
    how = "" if cfg.trainer.resume_mode == "auto" else " with trainer.resume_mode=auto"
    return f"stopped at step {step}; rerun to resume{how} from {latest[1]} (step {latest[0]})"


def _print_error(exc: BaseException, verbose: bool) -> None:
    """``error: <message>`` on stderr; with ``-v`` the traceback first (the exit status stays the caller's)."""
    if verbose:
        traceback.print_exception(exc)
    text = str(exc)
    if hasattr(exc, "summary"):  # a WorkerError: its last sentence points at a traceback only -v prints
        text = exc.summary + ("" if verbose else " (verl train -v shows the worker's traceback)")
    print(f"error: {text}", file=sys.stderr)


def _refused_checkpoint(cfg, trainer) -> str:
    """What to do when a worker cannot load the checkpoint being resumed (it verified, but does not load here)."""
    found = None
    if trainer is not None and hasattr(trainer, "checkpoints"):
        try:  # verified once already in this process: answered from the cache
            found = trainer.checkpoints.resolve_resume(cfg.trainer.resume_mode, cfg.trainer.resume_from_path)
        except Exception:  # noqa: BLE001 - only for the message
            found = None
    which = f"checkpoint {found[1]}" if found else "the checkpoint"
    return (
        f"{which} could not be loaded; nothing was trained. Rerunning resumes from it again: remove or fix it, "
        "resume from another (trainer.resume_mode=resume_path trainer.resume_from_path=<dir>/global_step_<N>), or "
        "start over (trainer.resume_mode=disable)"
    )


def run(args: argparse.Namespace) -> int:
    """Load and validate the config, then train; exit 2 on a config error, 1 on a run error, 128 + signal number
    when stopped by SIGINT / SIGTERM (130 / 143)."""
    from verl.trainer.stops import StopSignals, exit_status

    stops = StopSignals()
    stops.install()
    try:
        return _run(args, stops)
    except KeyboardInterrupt as exc:  # before the trainer existed (it handles its own stops)
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"verl train: {signal.Signals(signum).name}: stopped before training started", file=sys.stderr)
        return exit_status(signum)
    finally:
        stops.restore()


def _run(args: argparse.Namespace, stops) -> int:
    import attrs

    from verl.cli.run_config import load_run_config
    from verl.config import ConfigError
    from verl.config.run_dir import default_run_dir

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    try:
        cfg, base = load_run_config(args, lambda m: print(f"warning: {m}", file=sys.stderr))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"verl train: {base.describe()}")
    if cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path:  # the box model-written code runs in
        from verl.tools.config import describe_isolation

        for line in describe_isolation(cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path):
            print(f"verl train: {line}")
    if not cfg.data.train_files:
        print("error: data.train_files is not set; give the training .parquet/.jsonl file(s)", file=sys.stderr)
        return 2
    data = attrs.evolve(cfg.data, train_files=_expand(cfg.data.train_files), val_files=_expand(cfg.data.val_files))
    cfg = attrs.evolve(cfg, data=data)
    _ensure_gsm8k(list(cfg.data.train_files or ()) + list(cfg.data.val_files or ()))
    run_dir = Path(args.run_dir or default_run_dir(cfg.trainer.project_name, cfg.trainer.experiment_name))
    run_dir.mkdir(parents=True, exist_ok=True)

    # val_only validates whatever the run folder holds, a finished run included.
    finished = None if cfg.trainer.val_only else _already_finished(cfg, run_dir)
    if finished is not None:
        _save_config(cfg, run_dir, base.describe())
        return _export_if_missing(finished, run_dir)
    status = _keep_earlier_run(run_dir, cfg)
    if status:
        return status
    _save_config(cfg, run_dir, base.describe())

    from verl.algorithms.filter_groups import DynamicSamplingError
    from verl.controller import WorkerError
    from verl.controller.errors import PlacementError
    from verl.plugins import PluginError
    from verl.rewards.errors import RewardFunctionError
    from verl.trainer import faults
    from verl.trainer.checkpoint import CheckpointError, CheckpointSaveError
    from verl.trainer.guards import NonFiniteStepsError
    from verl.trainer.ppo_trainer import PPOTrainer
    from verl.trainer.stops import exit_status

    trainer = None
    exit_code = 1  # until training completes: a failure marks the loggers' run failed
    try:
        try:
            # Set-up errors (model path, dataset rows, chat template, unsupported options) are user
            # errors raised before any training: print them plainly; -v shows the traceback.
            trainer = PPOTrainer(cfg, run_dir, stops=stops)
            print("\n".join(f"verl train: {line}" for line in trainer.selection.splitlines()))
            trainer.init()
        except (ValueError, FileNotFoundError, WorkerError, PlacementError, PluginError) as exc:
            if args.verbose:
                raise
            print(f"error: {exc}", file=sys.stderr)
            return 2
        stops.install()  # again: ray.init (controller=ray) replaced the SIGTERM handler with its own
        try:
            val = trainer.fit()
            if cfg.trainer.val_only:
                shown = ", ".join(f"{k}={v:.4f}" for k, v in sorted(val.items()) if k.startswith("val-core/"))
                print(f"verl train: validation only (trainer.val_only) at step {trainer.global_steps}: {shown}")
                exit_code = 0
                return exit_code
            if trainer.already_finished:
                exit_code = _export_if_missing(trainer.checkpoints.latest()[1], run_dir)
                return exit_code
            if trainer.global_steps > 0:
                faults.check("export", trainer.global_steps)
                final = _write_final_hf(run_dir, trainer.actor_rollout_wg.export_hf)
                print(f"verl train: done, {trainer.global_steps} steps; final actor (HF folder): {final}")
            exit_code = 0
        except WorkerError as exc:
            # A worker raised or died (names class, rank, method); checkpoints are written atomically,
            # so the last complete one is intact and `verl train` with resume_mode=auto continues from it.
            if exc.method_name == "load_checkpoint" or isinstance(exc.__cause__, CheckpointError):
                # A worker could not load its part of the checkpoint being resumed: rerunning would fail alike.
                _print_error(exc, args.verbose)
                print(f"verl train: {_refused_checkpoint(cfg, trainer)}", file=sys.stderr)
                return 2
            if args.verbose:
                raise
            print(f"error: {exc.summary} (verl train -v shows the worker's traceback)", file=sys.stderr)
            print(f"verl train: {_resume_hint(cfg, trainer)}", file=sys.stderr)
            return 1
        except (NonFiniteStepsError, RewardFunctionError, DynamicSamplingError) as exc:
            # The run's own guards (docs/reliability.md; DAPO's round limit and metric, docs/dapo.md): the
            # message names the steps, sample or key and the fix.
            if args.verbose:
                raise
            print(f"error: {exc}", file=sys.stderr)
            print(f"verl train: stopped at step {trainer.global_steps}", file=sys.stderr)
            return 1
        except CheckpointSaveError as exc:
            # Stop rather than train on without checkpoints (a full disk rarely frees itself): the last
            # complete checkpoint is intact, so a rerun after fixing the disk loses only this step.
            if args.verbose:
                raise
            latest = trainer.checkpoints.latest()
            where = f"{latest[1]} (step {latest[0]})" if latest else "none (this run saved no checkpoint yet)"
            print(f"error: {exc}", file=sys.stderr)
            print(
                f"verl train: stopped at step {exc.step}; last complete checkpoint: {where}; free space or fix "
                "trainer.default_local_dir, then rerun with trainer.resume_mode=auto to continue from it",
                file=sys.stderr,
            )
            return 1
        except CheckpointError as exc:
            # Resume refused a checkpoint (damaged, old pickle format, non-finite, a state file that does not fit
            # this run): the message names the file and the way out; nothing was trained.
            _print_error(exc, args.verbose)
            return 2
    except KeyboardInterrupt as exc:  # SIGINT / SIGTERM (verl.trainer.stops): no traceback, the resume point
        signum = getattr(exc, "signum", signal.SIGINT)
        exit_code = exit_status(signum)
        print(f"verl train: {signal.Signals(signum).name}: {_resume_hint(cfg, trainer)}", file=sys.stderr)
        return exit_code
    finally:
        if trainer is not None:
            _close(trainer, exit_code, stops)
    return 0


def _close(trainer, exit_code: int, stops) -> None:
    """Close loggers and stop workers (Ray actors, reward worker processes); a stop signal meanwhile waits
    until they are down (a second one leaves them to the kernel and Ray's own clean-up)."""
    stops.hold("the workers are shut down")
    try:
        trainer.close(exit_code)  # != 0 marks the wandb / mlflow / swanlab / clearml run failed
    except KeyboardInterrupt:
        print("verl train: stopped while shutting down the workers", file=sys.stderr)
    finally:
        stops.discard()
