"""Run verl's own example scripts through our config loader and count how many load unchanged.

    python scripts/check_verl_scripts.py                       # the stored verl mirror (git dir)
    python scripts/check_verl_scripts.py --verl-root ~/src/verl  # a normal checkout
    python scripts/check_verl_scripts.py --json out.json -v
    python scripts/check_verl_scripts.py --recipe-mirror /work/.mirror/verl-project+verl-recipe/repo  # + DAPO recipe

For each ``examples/**/*.sh`` the script is *run by bash* in a scratch copy of ``examples/``, with
``python3``/``python``/``uv``/``torchrun`` (and a few commands with side effects: ``ray``, ``pip``, ``hf``,
``rm``, ...) replaced on ``PATH`` by a recorder that writes its argv to a file and exits. So every shell
feature the scripts use (``${VAR:-default}``, arrays, ``case``, ``$((...))``, line continuations, quoting,
``"$@"`` = nothing) is expanded by bash itself, exactly as for a user who runs the script with no
environment variables set. ``python3 -c ...`` probes fail (``import torch_npu`` -> the GPU branch).
``ray job submit [options] -- CMD ...`` runs ``CMD`` (so the recorder sees it); other ``ray`` commands, and
``cp``/``mkdir`` (copying a chat template, making a log folder: nothing a config depends on), do nothing.

With ``--recipe-mirror`` (a verl-recipe git dir or checkout) the DAPO recipe's ``recipe/dapo/*.sh`` (``dapo/*.sh``
in the split-out verl-recipe repository) are measured too: ``python3 -m recipe.dapo.main_dapo ARGS`` is
verl's ``main_ppo`` with the recipe's ``--config-name dapo_trainer`` (the built-in ``dapo_trainer`` here), and
each script is reported with its first error.

Each recorded ``... -m verl.trainer.main_ppo ARGS`` is translated exactly as ``python -m
verl.trainer.main_ppo ARGS`` translates it here (:func:`verl.cli.hydra_args.translate`), and the overrides go
through :func:`verl.config.load_config` from what that names: verl's defaults (``ppo_trainer`` = ``verl config
show --schema-defaults``), or a ``--config-path DIR --config-name NAME`` file composed with its ``defaults:``:

* ``+key=v`` / ``++key=v``: accepted by our loader as ``key=v`` (the key must exist in the schema);
* ``~key``: rejected (no deletion), reported with the loader's reason;
* ``--config-name`` of a config that is neither built in nor in the given ``--config-path`` (e.g.
  ``ppo_megatron_trainer``) does not load, and the overrides are still checked over verl's defaults so their
  keys show up in the counts;
* ``hydra.run.dir``/``hydra.searchpath`` are honoured, Hydra's logging settings dropped, other ``hydra.*``
  settings refused (:mod:`verl.cli.hydra_args`);
* another entry module (SFT trainer, generation, fully-async trainer, ...): the script does not load
  (``verl train`` runs PPO-family training only), reported with the module name.

Whether a backend *library* is installed here does not count: plugin availability probes are ignored,
and the plugins of this checkout that are not installed (``plugins/*/src``) are registered from source,
so ``rollout.name=vllm`` is checked against verl-vllm's options even in a venv without vLLM.

Prints one line per script and ``N of M scripts load unchanged``, then the failing keys by the number of
scripts they break. Exit status 0 (a measurement, not a gate).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import tomllib

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MIRROR = Path("/work/.mirror/verl-project+verl/repo")
PPO_MODULE = "verl.trainer.main_ppo"
DAPO_MODULE = "recipe.dapo.main_dapo"
#: Entry modules that are main_ppo here -> the ``--config-name`` they default to (None: main_ppo's own).
ENTRY_CONFIGS: dict[str, str | None] = {PPO_MODULE: None, DAPO_MODULE: "dapo_trainer"}
DEFAULT_RECIPE_MIRROR = Path("/work/.mirror/verl-project+verl-recipe/repo")
RECORDED = ("python3", "python", "uv", "torchrun", "accelerate", "deepspeed")
# Commands whose side effects must not happen in a measurement: turned into no-ops.
SILENCED = ("ray", "pip", "pip3", "hf", "huggingface-cli", "nvidia-smi", "npu-smi", "wget", "curl", "git", "rm")
SILENCED += ("kill", "pkill", "docker", "sleep", "modelscope", "sudo", "apt", "apt-get", "mpirun", "srun")
SILENCED += ("cp", "mkdir")

_RECORDER = r"""#!/bin/bash
# Written by check_verl_scripts.py: record this command line (NUL-separated) instead of running it.
name=$(basename "$0")
if [ "$name" = python3 ] || [ "$name" = python ]; then
    [ "$1" = -c ] && exit 1  # a probe (import torch_npu, ...): answer "not here"
fi
f=$(mktemp "$VERL_CAPTURE_DIR/cmd.XXXXXXXX")
{ printf '%s\0' "$name"; for a in "$@"; do printf '%s\0' "$a"; done; } > "$f"
exit 0
"""
# ``ray job submit [options] -- CMD ...`` runs CMD (found on PATH, so a recorded python3); other ray commands: no-op.
_RAY = r"""#!/bin/bash
while [ "$#" -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; exec "$@"; fi
    shift
done
exit 0
"""


@attrs.frozen
class Command:
    """One recorded entry-module invocation of a script."""

    module: str | None  # the ``-m`` module (or the .py file run), None when none was found
    config_path: str | None
    config_name: str | None
    overrides: tuple[str, ...]
    dropped: tuple[str, ...]  # arguments not passed to the loader as overrides, with why
    argv: tuple[str, ...]
    args: tuple[str, ...] = ()  # the arguments after the module, for verl.cli.hydra_args.translate


@attrs.frozen
class Result:
    """What happened to one script: ``loads`` true only when every main_ppo command loads."""

    script: str
    loads: bool
    reasons: tuple[str, ...]
    failing_keys: tuple[str, ...]
    commands: int
    inputs: tuple[str, ...] = ()  # variables / arguments the script insists on, set to placeholders
    next_keys: tuple[str, ...] = ()  # keys failing once the failing overrides are dropped (cross-field rules)


# ---------------------------------------------------------------------- capturing commands


def capture_commands(
    script_text: str,
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
    timeout: float = 30.0,
) -> tuple[list[list[str]], str]:
    """Run ``script_text`` with bash in ``workdir`` with the recorder shims; return (argv lists, stderr tail).

    The environment is empty apart from ``PATH`` (shims first), ``HOME`` (a scratch folder), the capture
    folder and ``env``, so every ``${VAR:-default}`` takes its default. ``args`` are the script's positional
    arguments. ``ulimit`` is a no-op (raising limits needs privileges a measurement has no use for). Each
    argv starts with the command name; the tail is empty when bash exited 0.
    """
    with tempfile.TemporaryDirectory(prefix="verl-capture-") as tmp:
        tmp_path = Path(tmp)
        shims, capture, home = tmp_path / "bin", tmp_path / "capture", tmp_path / "home"
        for folder in (shims, capture, home):
            folder.mkdir()
        for name in RECORDED:
            shim = shims / name
            shim.write_text(_RECORDER)
            shim.chmod(0o755)
        for name in SILENCED:
            shim = shims / name
            shim.write_text(_RAY if name == "ray" else "#!/bin/sh\nexit 0\n")
            shim.chmod(0o755)
        script, prelude = tmp_path / "script.sh", tmp_path / "prelude.sh"
        script.write_text(script_text)
        prelude.write_text("ulimit() { return 0; }\n")
        full_env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(home), "VERL_CAPTURE_DIR": str(capture)}
        full_env.update(LANG="C", BASH_ENV=str(prelude), **(env or {}))
        try:
            proc = subprocess.run(
                ["bash", str(script), *args], cwd=workdir, env=full_env, capture_output=True, text=True, timeout=timeout
            )
            tail = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            tail = f"timed out after {timeout:.0f}s"
        records = sorted(capture.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        argvs = [p.read_bytes().decode("utf-8", "replace").split("\0")[:-1] for p in records]
    return argvs, tail


_UNSET = re.compile(r"line \d+: (\w+): (unbound variable|.+)")
_USAGE = re.compile(r"Usage: \S+((?: <[^>]+>)+)")
# Values for variables a script insists on, where a path-like placeholder would pick no branch.
KNOWN_VALUES = {"INFER_BACKEND": "vllm", "ROLLOUT_NAME": "vllm", "ENGINE": "vllm", "ROLLOUT_ENGINE": "vllm"}


def capture_with_inputs(
    script_text: str, workdir: Path, *, attempts: int = 6
) -> tuple[list[list[str]], str, dict[str, str], list[str]]:
    """:func:`capture_commands`, retried with the inputs a script demands: a variable it requires
    (``set -u``'s "unbound variable", ``${VAR:?message}``) is set to a placeholder (or the value in
    :data:`KNOWN_VALUES`), and a ``Usage: script <a> <b>`` exit gets that many positional placeholders.

    Returns (argv lists, stderr tail of the last attempt, the variables set, the arguments given).
    """
    env: dict[str, str] = {}
    args: list[str] = []
    for _ in range(attempts):
        argvs, tail = capture_commands(script_text, workdir, env=env, args=args)
        if argvs or not tail:
            break
        unset, usage = _UNSET.findall(tail), _USAGE.search(tail)
        # ``set -u`` says "unbound variable", ``${VAR:?msg}`` says msg; an upper-case name rules out builtins (cd:).
        unset = [(n, m) for n, m in unset if m == "unbound variable" or n.isupper()]
        if unset and unset[-1][0] not in env:
            name = unset[-1][0]
            env[name] = KNOWN_VALUES.get(name, f"/placeholder/{name.lower()}")
        elif usage and not args:
            args = [f"/placeholder/arg{i}" for i in range(usage.group(1).count("<"))]
        else:
            break
    return argvs, tail, env, args


def parse_command(argv: Sequence[str]) -> Command:
    """Split a recorded argv (``python3 -m verl.trainer.main_ppo --config-name=x a.b=1 +c=2 ...``).

    ``uv run ... python3 -m M``, ``torchrun ... -m M`` and ``python3 file.py`` are understood. After the
    module, :func:`verl.cli.hydra_args.split_hydra_argv`: ``--config-path``/``--config-name`` (``-cp``/``-cn``,
    ``=`` or separate value) are Hydra flags, ``hydra.*`` settings are set apart, everything with ``=`` (or
    ``~key``) is an override.
    """
    from verl.cli.hydra_args import split_hydra_argv

    module: str | None = None
    start = len(argv)
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1].startswith(("verl", "recipe")):
            module, start = argv[i + 1], i + 2
            break
        if arg.endswith(".py") and i > 0:
            module, start = arg, i + 1
            break
    args = tuple(argv[start:])
    split = split_hydra_argv(args)
    dropped = [f"{a} (Hydra setting)" for a in split.hydra] + [f"{a} (Hydra flag)" for a in split.flags]
    dropped += [f"--config-dir={d} (Hydra search path)" for d in split.config_dirs]
    dropped += [f"{a} (not a key=value override)" for a in split.stray]
    return Command(module, split.config_path, split.config_name, split.overrides, tuple(dropped), tuple(argv), args)


# ---------------------------------------------------------------------- checking overrides


class _AnyAvailable:
    """A plugin manager view whose specs report themselves available (installs do not count here)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def get(self, kind: str, name: str) -> Any:
        spec = self._manager.get(kind, name)
        return attrs.evolve(spec, available=None) if attrs.has(type(spec)) and hasattr(spec, "available") else spec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


def plugin_manager(repo: Path = REPO) -> Any:
    """The process plugin manager plus this checkout's plugins that are not installed (from ``src``)."""
    from verl.plugins import get_plugin_manager

    manager = get_plugin_manager()
    for pyproject in sorted(repo.glob("plugins/*/pyproject.toml")):
        meta = tomllib.loads(pyproject.read_text())
        dist = meta.get("project", {}).get("name")
        entries = meta.get("project", {}).get("entry-points", {}).get("verl.plugins", {})
        try:
            importlib.metadata.distribution(dist)
            continue  # installed: already loaded through its entry point
        except importlib.metadata.PackageNotFoundError:
            pass
        sys.path.insert(0, str(pyproject.parent / "src"))
        for name, target in entries.items():
            manager.register(importlib.import_module(target), name=name, dist_name=dist)
    return _AnyAvailable(manager)


def check_overrides(overrides: Iterable[str], manager: Any, run: Any = None) -> list[tuple[str, str]]:
    """``(key, message)`` for every problem our loader finds with these overrides; [] = it loads.

    ``run``: the :class:`verl.cli.hydra_args.HydraRun` they come from (its config file, base and search path);
    None = verl's defaults. Each override is parsed on its own first, so one unparsable override (``~key``)
    does not hide the problems of the others.
    """
    from verl.config import ConfigError, load_config
    from verl.config.overrides import parse_override

    problems: list[tuple[str, str]] = []
    good: list[str] = []
    for text in overrides:
        try:
            parse_override(text)
            good.append(text)
        except ConfigError as exc:
            problems += [(issue.key, issue.message) for issue in exc.issues]
    try:
        load_config(
            None if run is None else run.config_file,
            good,
            base=None if run is None else run.base,
            search_path=() if run is None else run.search_path,
            plugin_manager=manager,
            on_warning=lambda _message: None,
        )
    except ConfigError as exc:
        problems += [(issue.key, issue.message) for issue in exc.issues]
    return problems


_INDEX = re.compile(r"\[\d+\]")


def check_script(name: str, text: str, workdir: Path, manager: Any) -> Result:
    """Capture the commands of one script and check every main_ppo command's overrides."""
    argvs, tail, env, args = capture_with_inputs(text, workdir)
    commands = [parse_command(argv) for argv in argvs]
    ppo = [c for c in commands if c.module in ENTRY_CONFIGS]
    reasons: list[str] = []
    keys: list[str] = []
    next_keys: list[str] = []
    notes = [f"needs {k}={v}" for k, v in env.items()] + ([f"needs {len(args)} arguments"] if args else [])
    if not ppo:
        others = sorted({c.module or shlex.join(c.argv[:3]) for c in commands})
        entries = " or ".join(ENTRY_CONFIGS)
        reasons.append(f"runs {', '.join(others)}, not {entries}" if others else "runs no python command")
        if tail:
            reasons.append(f"bash: {tail}")
        return Result(name, False, tuple(reasons + notes), (), 0, tuple(notes))
    from verl.cli.hydra_args import translate
    from verl.config import ConfigError

    for command in ppo:
        run = None
        try:
            run = translate(entry_args(command))
        except ConfigError as exc:  # what main_ppo refuses; the overrides are still checked over verl's defaults
            for issue in exc.issues:
                reasons.append(issue.message)
                keys.append(issue.key)
        problems = check_overrides(command.overrides, manager, run)
        for key, message in problems:
            key = _INDEX.sub("", key)
            reasons.append(f"{key}: {message}")
            keys.append(key)
        # An unknown key or a wrong type stops the loader before the cross-field rules: drop the overrides that
        # failed and look again, so the report also shows what would fail next.
        failed = {_INDEX.sub("", k) for k, _ in problems}
        rest = [o for o in command.overrides if not any(f"{_override_key(o)}.".startswith(f"{k}.") for k in failed)]
        if problems and len(rest) < len(command.overrides):
            for key, message in check_overrides(rest, manager, run):
                next_keys.append(_INDEX.sub("", key))
                reasons.append(f"(next) {key}: {message}")
    return Result(
        name,
        not reasons,
        tuple(dict.fromkeys(reasons)),
        tuple(dict.fromkeys(keys)),
        len(ppo),
        tuple(notes),
        tuple(dict.fromkeys(next_keys)),
    )


def entry_args(command: Command) -> tuple[str, ...]:
    """The arguments main_ppo gets for ``command``: an entry module's own ``--config-name`` default
    (:data:`ENTRY_CONFIGS`, e.g. ``dapo_trainer`` for the DAPO recipe's ``main_dapo``) goes first unless the
    command names a config itself."""
    default = ENTRY_CONFIGS.get(command.module or "")
    if default is None or command.config_name is not None:
        return command.args
    return ("--config-name", default, *command.args)


def _override_key(text: str) -> str:
    return text.strip().lstrip("+~").partition("=")[0].strip()


# ---------------------------------------------------------------------- sources of scripts


def scripts_from_git(
    git_dir: Path, workdir: Path, folder: str = "examples", pattern: str = "**/*.sh"
) -> list[tuple[str, str]]:
    """``folder/pattern`` scripts of ``HEAD`` of a bare git dir; ``folder`` is unpacked into ``workdir``."""
    out = subprocess.run(
        ["git", "-C", str(git_dir), "archive", "--format=tar", "HEAD", folder], capture_output=True, check=True
    ).stdout
    with tempfile.TemporaryFile() as tar_file:
        tar_file.write(out)
        tar_file.seek(0)
        with tarfile.open(fileobj=tar_file) as tar:
            tar.extractall(workdir, filter="data")
    return scripts_from_tree(workdir, folder, pattern)


def scripts_from_tree(root: Path, folder: str = "examples", pattern: str = "**/*.sh") -> list[tuple[str, str]]:
    """``folder/pattern`` scripts under a checkout ``root`` (default ``examples/**/*.sh``), as (relative path,
    text), sorted."""
    return [
        (str(p.relative_to(root)), p.read_text(encoding="utf-8", errors="replace"))
        for p in sorted((root / folder).glob(pattern))
    ]


#: Where the DAPO recipe lives: ``recipe/dapo`` in verl (and verl-recipe as a submodule), ``dapo`` in verl-recipe.
RECIPE_FOLDERS = ("recipe/dapo", "dapo")


def recipe_scripts(source: Path, workdir: Path) -> list[tuple[str, str]]:
    """The DAPO recipe's ``*.sh`` (top level of the recipe folder) from a git dir or a checkout ``source``,
    copied or unpacked into ``workdir`` (the scripts' working directory).

    Raises:
        SystemExit: ``source`` holds no recipe folder (:data:`RECIPE_FOLDERS`).
    """
    if (source / "HEAD").is_file() and (source / "objects").is_dir():  # a bare git dir
        listed = subprocess.run(
            ["git", "-C", str(source), "ls-tree", "-d", "--name-only", "HEAD", *RECIPE_FOLDERS],
            capture_output=True,
            text=True,
        ).stdout.split()
        for folder in RECIPE_FOLDERS:
            if folder in listed:
                return scripts_from_git(source, workdir, folder, "*.sh")
    else:
        for folder in RECIPE_FOLDERS:
            if (source / folder).is_dir():
                target = workdir / folder
                target.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run(["cp", "-r", str(source / folder), str(target)], check=True)
                return scripts_from_tree(workdir, folder, "*.sh")
    raise SystemExit(f"--recipe-mirror {source}: no {' or '.join(RECIPE_FOLDERS)} folder there")


def git_commit(source: Path) -> str:
    """``"<short hash> <commit date>"`` of a git dir or checkout, or ``"unknown"`` when git cannot tell."""
    proc = subprocess.run(["git", "-C", str(source), "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def verl_commit(args: argparse.Namespace) -> str:
    """:func:`git_commit` of the measured verl checkout (``--verl-root``, else ``--mirror``)."""
    return git_commit(args.verl_root or args.mirror)


def print_results(results: Sequence[Result], *, verbose: bool, first_error: bool = False) -> None:
    """One line per script: ``loads`` or ``FAILS`` with the failing keys (``first_error``: the first reason)."""
    for r in results:
        if r.loads:
            print(f"loads  {r.script}")
            continue
        why = r.reasons[0] if first_error else ("; ".join(r.failing_keys) or r.reasons[0])
        print(f"FAILS  {r.script}  [{why}]")
        if verbose and not r.loads:
            for reason in r.reasons:
                print(f"         - {reason}")


def print_keys(results: Sequence[Result], top: int) -> None:
    """The failing keys by the number of scripts each breaks, then what fails next."""
    counts: collections.Counter[str] = collections.Counter(k for r in results for k in r.failing_keys)
    print("\nfailing keys (scripts broken by each):")
    for key, n in counts.most_common(top):
        print(f"  {n:4}  {key}")
    behind: collections.Counter[str] = collections.Counter(k for r in results for k in r.next_keys)
    if behind:
        print("\nfailing next, once the failing overrides are dropped (scripts):")
        for key, n in behind.most_common(top):
            print(f"  {n:4}  {key}")


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every example script (and with ``--recipe-mirror`` the DAPO recipe's); print one line each,
    ``N of M scripts load unchanged`` and the failing keys.

    Returns 0 (the count is the result, not a pass/fail).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl-root", type=Path, help="a verl checkout (with a work tree)")
    parser.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR, help="a verl git dir (default: %(default)s)")
    parser.add_argument(
        "--recipe-mirror",
        type=Path,
        help=f"also measure the DAPO recipe's scripts of this verl-recipe git dir or checkout (e.g. {DEFAULT_RECIPE_MIRROR})",
    )
    parser.add_argument("--skip-examples", action="store_true", help="measure the recipe only (with --recipe-mirror)")
    parser.add_argument("--json", type=Path, help="also write the per-script results here")
    parser.add_argument("--top", type=int, default=30, help="failing keys to list (default: %(default)s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every reason of each failing script")
    args = parser.parse_args(argv)
    manager = plugin_manager()
    results: list[Result] = []
    if not args.skip_examples:
        with tempfile.TemporaryDirectory(prefix="verl-examples-") as tmp:
            workdir = Path(tmp)
            if args.verl_root is not None:
                # A scratch copy: scripts may mkdir or write logs relative to the checkout.
                subprocess.run(["cp", "-r", str(args.verl_root / "examples"), str(workdir)], check=True)
                scripts = scripts_from_tree(workdir)
            else:
                scripts = scripts_from_git(args.mirror, workdir)
            results = [check_script(name, text, workdir, manager) for name, text in scripts]
        print_results(results, verbose=args.verbose)
        ppo = sum(1 for r in results if r.commands)
        loaded = sum(r.loads for r in results)
        print(f"\nverl {verl_commit(args)}: {loaded} of {len(results)} scripts load unchanged ({ppo} run {PPO_MODULE})")
        print_keys(results, args.top)
    recipe: list[Result] = []
    if args.recipe_mirror is not None:
        with tempfile.TemporaryDirectory(prefix="verl-recipe-") as tmp:
            workdir = Path(tmp)
            recipe = [check_script(n, t, workdir, manager) for n, t in recipe_scripts(args.recipe_mirror, workdir)]
        print("\nDAPO recipe:")
        print_results(recipe, verbose=args.verbose, first_error=True)
        entry = sum(1 for r in recipe if r.commands)
        loaded = sum(r.loads for r in recipe)
        print(
            f"\nverl-recipe {git_commit(args.recipe_mirror)}: DAPO recipe {loaded} of {len(recipe)} scripts load "
            f"unchanged ({entry} run {' or '.join(ENTRY_CONFIGS)})"
        )
        print_keys(recipe, args.top)
    if args.json:
        args.json.write_text(json.dumps([attrs.asdict(r) for r in results + recipe], indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
