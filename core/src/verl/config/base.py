"""Which config a run starts from (its *base*), and the Hydra ``defaults:`` list that names it.

A run's config is built in layers: base <- CONFIG file <- ``key=value`` overrides. The base is one of

* ``ppo_trainer``: verl's full default config, which is this package's bare schema (``RootConfig()``:
  GAE with a critic, ``data.train_batch_size=1024``, no data files);
* a run config shipped with verl-core (``core/src/verl/trainer/config/<name>.yaml``, e.g.
  ``gsm8k_grpo_smollm2_cpu``: GRPO on GSM8K with SmolLM2 on CPU, what ``verl train`` runs with no file).

The rule (``verl train`` / ``verl config show``): with no CONFIG file the base is the default run config;
a file names its base the way verl's own YAML files do, with a Hydra defaults list
(``defaults: [ppo_trainer, _self_]`` or ``defaults: [gsm8k_grpo_smollm2_cpu, _self_]``); a file without one
starts from ``ppo_trainer``, as it would in verl. ``--schema-defaults`` forces ``ppo_trainer``. The base
used is printed (one line) and written at the top of the run's ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from verl.config.errors import ConfigError

#: verl's name for its full default config (``verl/trainer/config/ppo_trainer.yaml``).
SCHEMA_BASE_NAME = "ppo_trainer"
#: Run configs shipped inside the package (data files, not imported).
RUN_CONFIG_DIR = Path(__file__).resolve().parent.parent / "trainer" / "config"
#: What ``verl train`` runs when no CONFIG file is given.
DEFAULT_RUN_CONFIG_NAME = "gsm8k_grpo_smollm2_cpu"
_SELF = "_self_"


@attrs.frozen
class ConfigBase:
    """The bottom layer of a config.

    Attributes:
        name: ``"ppo_trainer"`` (the bare schema) or the stem of a shipped run config.
        path: the run config's YAML file; ``None`` for ``ppo_trainer``.
        reason: why this base was chosen (printed after it), e.g. ``"no CONFIG file given"``.
    """

    name: str
    path: Path | None
    reason: str

    def describe(self) -> str:
        """One line naming the base and why it was chosen, e.g. for the console and ``config.yaml``."""
        if self.path is None:
            from verl.config.schema import RootConfig

            bare = RootConfig()
            estimator = bare.algorithm.adv_estimator
            what = (
                f"{SCHEMA_BASE_NAME} (verl's defaults, the bare schema: algorithm.adv_estimator={estimator}"
                f"{' with a critic' if estimator == 'gae' else ''}, data.train_batch_size={bare.data.train_batch_size})"
            )
        else:
            what = f"{self.name} (built-in run config {self.path})"
        return f"base config: {what}; {self.reason}"


def run_configs() -> dict[str, Path]:
    """``{name: path}`` of the run configs shipped in :data:`RUN_CONFIG_DIR`, sorted by name."""
    return {p.stem: p for p in sorted(RUN_CONFIG_DIR.glob("*.yaml"))}


def schema_base(reason: str) -> ConfigBase:
    """The ``ppo_trainer`` base (bare schema defaults)."""
    return ConfigBase(SCHEMA_BASE_NAME, None, reason)


def named_base(name: str, reason: str, *, key: str = "defaults") -> ConfigBase:
    """The base called ``name``: ``ppo_trainer`` or a shipped run config (``.yaml`` suffix optional).

    Raises:
        ConfigError: on ``key``, for a name that is neither, listing the names there are.
    """
    stem = name.removesuffix(".yaml")
    if stem == SCHEMA_BASE_NAME:
        return schema_base(reason)
    configs = run_configs()
    if stem not in configs:
        known = ", ".join([SCHEMA_BASE_NAME, *configs])
        raise ConfigError(f"{key}: unknown base config {name!r}; known: {known}", key=key)
    return ConfigBase(stem, configs[stem], reason)


def base_from_defaults(defaults: Any, file: str | Path) -> ConfigBase:
    """The base named by a file's Hydra ``defaults:`` list.

    Accepted: ``[ppo_trainer, _self_]``, ``[<run config>, _self_]``, either without ``_self_``, and
    ``[_self_]`` alone (= ``ppo_trainer``). ``_self_`` last means the file's values win over the base, which
    is Hydra's default order and the only one supported.

    Raises:
        ConfigError: (key ``defaults``) not a list of names, ``_self_`` not last, more than one base, an
            ``override`` entry (Hydra config groups such as ``model_engine``; set the backend key instead,
            e.g. ``actor_rollout_ref.actor.strategy=megatron``), or an unknown base name.
    """
    where = f"config file '{file}': defaults"
    entries = list(defaults) if isinstance(defaults, list | tuple) else None
    if entries is None:
        raise ConfigError(f"{where} must be a list such as [ppo_trainer, _self_], got {defaults!r}", key="defaults")
    for entry in entries:
        if not isinstance(entry, str):
            text = ", ".join(f"{k}: {v}" for k, v in entry.items()) if isinstance(entry, Mapping) else repr(entry)
            raise ConfigError(
                f"{where}: entry {{{text}}} selects a Hydra config group, which verl.config does not have; "
                "keep the base name (ppo_trainer) and set the value itself in the file (a backend: "
                "actor_rollout_ref.actor.strategy / actor_rollout_ref.rollout.name)",
                key="defaults",
            )
    if _SELF in entries and entries[-1] != _SELF:
        raise ConfigError(
            f"{where}: '_self_' must come last (the file's values override its base); got {entries}",
            key="defaults",
        )
    names = [e for e in entries if e != _SELF]
    if len(names) > 1:
        raise ConfigError(f"{where}: name one base config, got {names}", key="defaults")
    reason = f"named by the defaults list of '{file}'"
    return named_base(names[0], reason) if names else schema_base(reason)
