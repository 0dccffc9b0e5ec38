"""verl's Hydra command line (``python3 -m verl.trainer.main_ppo ARGS``) translated into a ``verl train`` run.

verl's entry point is ``@hydra.main(config_path="config", config_name="ppo_trainer")``. Its arguments mean here:

* ``key=value``, ``+key=value``, ``++key=value``: overrides (the loader accepts the ``+`` forms for keys of the
  schema); ``~key`` (deletion) is refused with the loader's reason.
* ``--config-path/-cp DIR``: where ``--config-name`` is looked up; relative to ``verl/trainer/`` (the directory
  of ``main_ppo.py``, Hydra's rule), default ``config``. verl's config directory (``config``, ``./config``,
  ``pkg://verl.trainer.config``, any path ending in ``verl/trainer/config``) holds the built-in configs:
  ``ppo_trainer`` (verl's defaults = ``verl train --schema-defaults``), ``dapo_trainer`` (verl's DAPO recipe
  config, what ``python3 -m recipe.dapo.main_dapo`` starts from) and the shipped run configs. Another
  directory's ``NAME.yaml`` is loaded as the CONFIG file, its ``defaults:`` list composed
  (:mod:`verl.config.compose`). ``--config-dir/-cd DIR`` adds a directory to the search path.
* ``--config-name/-cn NAME``: default ``ppo_trainer``.
* ``hydra.run.dir=DIR``: Hydra's output folder, where verl's runs get ``.hydra/config.yaml`` and the job log:
  here the run folder (``config.yaml``, ``metrics.jsonl``, ``final_hf/``), as ``verl train --run-dir``, but
  checkpoints stay at ``trainer.default_local_dir`` (verl's default ``checkpoints/<project>/<experiment>``), as
  in verl, where the Hydra folder does not move them.
* ``hydra.searchpath=[...]``: the search path for ``--config-name`` and ``defaults:`` names.
* ``hydra.job.chdir=false`` (the default of verl's Hydra), ``hydra.job.name``, ``hydra.output_subdir``,
  ``hydra.verbose``, ``hydra.job_logging.*``/``hydra.hydra_logging.*``, ``hydra/job_logging=...``,
  ``hydra/hydra_logging=...``: Hydra's logging and bookkeeping, dropped with a printed note.
* ``--cfg job`` (``-c job``): print the composed config and exit (``verl config show``); ``--resolve`` and
  ``--run`` are accepted (the config is always resolved; a single run is the only mode).
* Refused with the reason: every other ``hydra.*`` key (launchers, sweepers, ``hydra.job.chdir=true``,
  ``hydra.job.env_set``), ``--multirun/-m``, ``--cfg hydra|all``, ``--info``, ``--package``, ``--hydra-help``,
  ``--shell-completion``, ``--experimental-rerun``.

``scripts/check_verl_scripts.py`` uses the same functions to measure which of verl's scripts load.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePath

import attrs

from verl.config.base import RUN_CONFIG_DIR, SCHEMA_BASE_NAME, ConfigBase, named_base, run_configs
from verl.config.compose import BUILTIN, resolve_search_entry
from verl.config.errors import ConfigError, ConfigIssue

#: ``verl/trainer/``: Hydra resolves a relative ``--config-path`` against the directory of ``main_ppo.py``.
TRAINER_DIR = RUN_CONFIG_DIR.parent
DEFAULT_CONFIG_PATH = "config"

_VALUE_FLAGS = {"--config-path": "cp", "-cp": "cp", "--config-name": "cn", "-cn": "cn", "--config-dir": "cd"}
_VALUE_FLAGS |= {"-cd": "cd", "--cfg": "cfg", "-c": "cfg", "--package": "p", "-p": "p"}
_OK_FLAGS = ("--resolve", "--run", "-r")
_REFUSED_FLAGS = {
    "--multirun": "sweeps are not run here; run one command per value",
    "-m": "sweeps are not run here; run one command per value",
    "--info": "Hydra's --info has no counterpart; verl config show prints the composed config",
    "-i": "Hydra's --info has no counterpart; verl config show prints the composed config",
    "--hydra-help": "there is no Hydra here; see --help",
    "--shell-completion": "there is no Hydra shell completion here",
    "-sc": "there is no Hydra shell completion here",
    "--experimental-rerun": "there is no Hydra rerun here; rerun the same command",
}
#: Hydra's logging and bookkeeping (``hydra.<prefix>...`` or ``hydra/<group>=``): dropped with a note.
DROPPED_HYDRA = ("job.name", "output_subdir", "verbose", "job_logging", "hydra_logging")


@attrs.frozen
class HydraCommand:
    """A Hydra command line split into its parts, nothing interpreted yet.

    Attributes:
        config_path / config_name: ``--config-path`` / ``--config-name`` (``-cp``/``-cn``) values, None if absent.
        config_dirs: ``--config-dir`` values.
        overrides: ``key=value``, ``+key=value``, ``++key=value`` and ``~key`` as written.
        hydra: ``hydra.*`` (and ``hydra/group=``) overrides, ``+``/``~`` prefixes kept.
        flags: other ``-x``/``--x`` arguments, with their value for ``--cfg``/``--package`` (``"--cfg=job"``).
        stray: arguments that are none of these (no ``=``).
    """

    config_path: str | None = None
    config_name: str | None = None
    config_dirs: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    hydra: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    stray: tuple[str, ...] = ()


@attrs.frozen
class HydraRun:
    """What a Hydra command line asks ``verl train`` for.

    Attributes:
        config_file: the CONFIG file (``--config-path DIR --config-name NAME`` outside verl's config directory).
        base: the built-in config ``--config-name`` names when there is no file (``ppo_trainer`` = the bare
            schema, or a shipped run config); None with a file (its ``defaults:`` list names the base).
        overrides: the ``key=value`` overrides, in order.
        run_dir: ``hydra.run.dir``, else None.
        search_path: resolved ``--config-dir`` and ``hydra.searchpath`` entries, in order.
        notes: one line per dropped argument, with why (to print).
        show: ``--cfg job``: print the config instead of training.
    """

    config_file: Path | None
    base: ConfigBase | None
    overrides: tuple[str, ...]
    run_dir: str | None = None
    search_path: tuple[str | Path, ...] = ()
    notes: tuple[str, ...] = ()
    show: bool = False


def split_hydra_argv(argv: Sequence[str]) -> HydraCommand:
    """Split the arguments after ``-m verl.trainer.main_ppo`` (``--flag=value`` and ``--flag value`` both)."""
    found: dict[str, list[str]] = {"cp": [], "cn": [], "cd": [], "over": [], "hydra": [], "flags": [], "stray": []}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=")
        if flag in _VALUE_FLAGS:
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            kind = _VALUE_FLAGS[flag]
            if kind in ("cp", "cn", "cd"):
                found[kind].append(value.strip())
            else:
                found["flags"].append(f"{flag}={value}")
        elif arg.startswith("--") or (arg.startswith("-") and len(arg) <= 3 and "=" not in arg):
            found["flags"].append(arg)
        elif arg.lstrip("+~").startswith(("hydra.", "hydra/")):
            found["hydra"].append(arg)
        elif "=" in arg or arg.startswith("~"):
            found["over"].append(arg)
        elif arg:
            found["stray"].append(arg)
        i += 1
    return HydraCommand(
        config_path=found["cp"][-1] if found["cp"] else None,
        config_name=found["cn"][-1] if found["cn"] else None,
        config_dirs=tuple(found["cd"]),
        overrides=tuple(found["over"]),
        hydra=tuple(found["hydra"]),
        flags=tuple(found["flags"]),
        stray=tuple(found["stray"]),
    )


def translate(argv: Sequence[str], *, module_dir: Path = TRAINER_DIR) -> HydraRun:
    """``python -m verl.trainer.main_ppo ARGS`` as a :class:`HydraRun` (module docstring for each form).

    Args:
        argv: the arguments after the module name.
        module_dir: where a relative ``--config-path`` starts (``verl/trainer/``).

    Raises:
        ConfigError: every refused argument at once (``~key``, a refused ``hydra.*`` key or flag, a stray
            argument, a ``--config-name`` found nowhere), each naming the argument and the fix.
    """
    return translate_command(split_hydra_argv(argv), module_dir=module_dir)


def translate_command(command: HydraCommand, *, module_dir: Path = TRAINER_DIR) -> HydraRun:
    """:func:`translate` of an already split command line."""
    from verl.config.overrides import parse_override
    from verl.config.yaml_io import parse_scalar

    issues: list[ConfigIssue] = []
    notes: list[str] = []
    show = False
    for flag in command.flags:
        name, _, value = flag.partition("=")
        if name in ("--cfg", "-c") and value == "job":
            show = True
        elif name in ("--cfg", "-c"):
            issues.append(
                ConfigIssue(name, f"{flag}: only --cfg job (the run's config) exists here; there is no Hydra config")
            )
        elif name in _OK_FLAGS:
            continue
        elif name in _REFUSED_FLAGS:
            issues.append(ConfigIssue(name, f"{flag}: {_REFUSED_FLAGS[name]}"))
        else:
            issues.append(ConfigIssue(name, f"{flag}: not an option of python -m verl.trainer.main_ppo (see --help)"))
    issues += [
        ConfigIssue(s, f"argument {s!r} is not a key=value override (e.g. data.train_batch_size=8)")
        for s in command.stray
    ]
    for text in command.overrides:
        try:
            parse_override(text)
        except ConfigError as exc:
            issues.extend(exc.issues)
    run_dir: str | None = None
    search: list[str | Path] = []
    for text in command.config_dirs:
        try:
            search.append(_config_dir(text, module_dir, flag="--config-dir", relative_to=Path.cwd()))
        except ConfigError as exc:
            issues.extend(exc.issues)
    for text in command.hydra:
        body = text.lstrip("+~")
        key, _, raw = body.partition("=")
        subkey = key.removeprefix("hydra.").removeprefix("hydra/")
        if text.startswith("~"):
            issues.append(ConfigIssue(key, f"override '{text}': deleting a Hydra setting has no meaning here"))
        elif key == "hydra.run.dir":
            value = str(parse_scalar(raw.strip()))
            if "${" in value:
                issues.append(ConfigIssue(key, f"{text}: interpolations are not resolved here; give the folder itself"))
            else:
                run_dir = value
                notes.append(
                    f"{text}: the run folder (config.yaml, metrics.jsonl, final_hf/), as verl train --run-dir; "
                    "checkpoints stay at trainer.default_local_dir, as in verl"
                )
        elif key == "hydra.searchpath":
            entries = parse_scalar(raw.strip())
            for entry in entries if isinstance(entries, list) else [entries]:
                try:
                    resolved = resolve_search_entry(entry)
                except ConfigError as exc:
                    issues.extend(exc.issues)
                    continue
                if resolved not in search:
                    search.append(resolved)
        elif key == "hydra.job.chdir" and parse_scalar(raw.strip()) is False:
            notes.append(f"{text}: dropped (the working directory never changes here)")
        elif key == "hydra.job.chdir":
            issues.append(
                ConfigIssue(
                    key,
                    f"{text}: runs here keep the working directory (verl's Hydra default, chdir false), so "
                    "relative paths mean the same; remove it",
                )
            )
        elif subkey.startswith(DROPPED_HYDRA):
            notes.append(
                f"{text}: dropped (Hydra's own logging/bookkeeping; the run logs to the console and writes "
                "config.yaml into the run folder)"
            )
        else:
            issues.append(
                ConfigIssue(
                    key,
                    f"{text}: a Hydra launcher/sweeper setting with no meaning for verl train; remove it "
                    "(hydra.run.dir and hydra.searchpath are honoured)",
                )
            )
    config_file, base = None, None
    try:
        config_file, base = _primary(command, module_dir, search)
    except ConfigError as exc:
        issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    return HydraRun(config_file, base, command.overrides, run_dir, tuple(search), tuple(notes), show)


def _config_dir(text: str, module_dir: Path, *, flag: str, relative_to: Path) -> str | Path:
    """A ``--config-path``/``--config-dir`` value as :data:`BUILTIN` or an existing directory."""
    if "://" in text:
        return resolve_search_entry(text, key=flag)
    path = Path(text) if os.path.isabs(text) else relative_to / text
    if path.resolve() == RUN_CONFIG_DIR or PurePath(os.path.normpath(path)).parts[-3:] == ("verl", "trainer", "config"):
        return BUILTIN
    if not path.is_dir():
        where = "verl/trainer/ (the directory of main_ppo.py, Hydra's rule)" if relative_to == module_dir else "."
        raise ConfigError(
            f"{flag}={text}: no directory {path} (a relative path starts at {where}); give an absolute path, "
            f"e.g. {flag}=$(pwd)/{text}",
            key=flag,
        )
    return path


def _primary(
    command: HydraCommand, module_dir: Path, search: Sequence[str | Path]
) -> tuple[Path | None, ConfigBase | None]:
    name = (command.config_name or SCHEMA_BASE_NAME).removesuffix(".yaml")
    key = f"--config-name={name}"
    where = _config_dir(
        command.config_path or DEFAULT_CONFIG_PATH, module_dir, flag="--config-path", relative_to=module_dir
    )
    looked: list[str] = []
    for entry in dict.fromkeys([where, *search]):
        if entry == BUILTIN:
            if name == SCHEMA_BASE_NAME or name in run_configs():
                given = key if command.config_name else f"{key} (verl's default)"
                return None, named_base(name, f"python -m verl.trainer.main_ppo {given}", key=key)
            continue
        candidate = Path(entry) / f"{name}.yaml"
        if candidate.is_file():
            return candidate, None
        looked.append(str(candidate))
    if name == "ppo_megatron_trainer":
        fix = (
            "verl's Megatron variant of ppo_trainer is not a config here: keep the ppo_trainer defaults and "
            "select the engine with model_engine=megatron (or actor_rollout_ref.actor.strategy=megatron)"
        )
    else:
        known = ", ".join([SCHEMA_BASE_NAME, *run_configs()])
        fix = f"verl's {name}.yaml is not a built-in config here (built-in: {known})"
    files = f"; no {' or '.join(looked)}" if looked else ""
    raise ConfigError(f"{key}: {fix}{files}; or give --config-path DIR holding {name}.yaml", key=key)
