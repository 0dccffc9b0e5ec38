"""Which config a run starts from (its *base*), and the Hydra ``defaults:`` list that names it.

A run's config is built in layers: base <- CONFIG file <- ``key=value`` overrides. The base is one of

* ``ppo_trainer``: verl's full default config, which is this package's bare schema (``RootConfig()``:
  GAE with a critic, ``data.train_batch_size=1024``, no data files);
* a run config shipped with verl-core (``core/src/verl/trainer/config/<name>.yaml``, e.g.
  ``gsm8k_grpo_smollm2_cpu``: GRPO on GSM8K with SmolLM2 on CPU, what ``verl train`` runs with no file).

The rule (``verl train`` / ``verl config show``): with no CONFIG file the base is the default run config;
a file names its base the way verl's own YAML files do, with a Hydra defaults list
(``defaults: [ppo_trainer, _self_]`` or ``defaults: [gsm8k_grpo_smollm2_cpu, _self_]``), which may also name
the user's own YAML files, composed as Hydra composes them (:mod:`verl.config.compose`); a file without one
starts from ``ppo_trainer``, as it would in verl. ``--schema-defaults`` forces ``ppo_trainer``. The base
used (and, for a chain, every file composed) is printed (one line) and written at the top of the run's
``config.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from verl.config.errors import ConfigError

#: verl's name for its full default config (``verl/trainer/config/ppo_trainer.yaml``).
SCHEMA_BASE_NAME = "ppo_trainer"
#: Run configs shipped inside the package (data files, not imported).
RUN_CONFIG_DIR = Path(__file__).resolve().parent.parent / "trainer" / "config"
#: What ``verl train`` runs when no CONFIG file is given.
DEFAULT_RUN_CONFIG_NAME = "gsm8k_grpo_smollm2_cpu"


@attrs.frozen
class ConfigBase:
    """The bottom layer of a config.

    Attributes:
        name: ``"ppo_trainer"`` (the bare schema) or the stem of a shipped run config.
        path: the run config's YAML file; ``None`` for ``ppo_trainer``.
        reason: why this base was chosen (printed after it), e.g. ``"no CONFIG file given"``.
        chain: every layer composed from a CONFIG file's defaults lists, in merge order (built-in configs by
            name, files by path), when it is more than the base and the file itself; ``()`` otherwise.
    """

    name: str
    path: Path | None
    reason: str
    chain: tuple[str, ...] = ()

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
        composed = f"; composed in this order: {' <- '.join(self.chain)}" if self.chain else ""
        return f"base config: {what}{composed}; {self.reason}"


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
