"""How the conformance kits build what they test: a RootConfig from overrides, then the plugin's real spec.

Every kit turns its settings into Hydra-style ``key=value`` overrides, loads them with
:func:`verl.config.load_config` (so a plugin's options are validated exactly as at config load, unknown keys
included) and calls the factory of the spec the plugin manager returns, with the worker's signature
(:class:`verl.workers.actor_rollout_ref.ActorRolloutRefWorker.init_model`): the role's validated options
(:func:`verl.config.role_options`) as ``options=``, through :func:`build_training_engine`,
:func:`build_rollout_engine` and :func:`build_checkpoint_engine`. Nothing is built through a side constructor.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

# Sections whose ``engine_kwargs.<name>`` hold each kind's options (the worker reads them there).
ENGINE_KWARGS_PREFIX: dict[str, str] = {
    "training_engine": "actor_rollout_ref.actor.engine_kwargs",
    "rollout_engine": "actor_rollout_ref.rollout.engine_kwargs",
    "checkpoint_engine": "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs",
}


def kwargs_overrides(prefix: str, options: Mapping[str, Any] | None) -> list[str]:
    """Dotted overrides ``<prefix>.<key>=<value>`` for a (nested) mapping of options.

    Nested mappings become deeper keys (``{"mixed_precision": {"param_dtype": "bf16"}}`` ->
    ``<prefix>.mixed_precision.param_dtype="bf16"``), so an unknown key is reported with its full dotted
    name; an empty mapping stays one value (``{}``). Values are written as JSON, which the config loader
    reads as YAML (strings stay strings: ``"1.0"`` is not a float).

    Raises:
        TypeError: ``options`` is not a mapping, or a value cannot be written as JSON.
    """
    if options is None:
        return []
    if not isinstance(options, Mapping):
        raise TypeError(f"engine options for {prefix} must be a mapping (dict), got {type(options).__name__}")
    out: list[str] = []
    for key, value in options.items():
        if isinstance(value, Mapping) and value:
            out.extend(kwargs_overrides(f"{prefix}.{key}", value))
            continue
        try:
            text = json.dumps(dict(value) if isinstance(value, Mapping) else value)
        except TypeError as exc:
            raise TypeError(f"{prefix}.{key}={value!r} cannot be written as a config value: {exc}") from exc
        out.append(f"{prefix}.{key}={text}")
    return out


def engine_overrides(kind: str, name: str, options: Mapping[str, Any] | None) -> list[str]:
    """``engine_kwargs.<name>.*`` overrides of engine ``name`` of ``kind`` (see :data:`ENGINE_KWARGS_PREFIX`).

    Raises:
        ValueError: ``kind`` has no engine_kwargs section.
    """
    if kind not in ENGINE_KWARGS_PREFIX:
        raise ValueError(f"no engine_kwargs section for kind {kind!r}; one of {sorted(ENGINE_KWARGS_PREFIX)}")
    return kwargs_overrides(f"{ENGINE_KWARGS_PREFIX[kind]}.{name}", options)


def load_kit_config(overrides: Iterable[str]) -> Any:
    """``load_config(overrides=...)`` with the kit's overrides; a ConfigError fails the test with the overrides.

    Returns:
        The resolved :class:`verl.config.RootConfig`.
    """
    import pytest

    from verl.config import ConfigError, load_config

    overrides = list(overrides)
    try:
        return load_config(overrides=overrides)
    except ConfigError as exc:
        shown = "\n  ".join(overrides)
        pytest.fail(
            f"the kit's config does not load (fix the engine_kwargs / config_overrides fixtures):\n{exc}\n"
            f"overrides:\n  {shown}",
            pytrace=False,
        )


def plugin_spec(kind: str, name: str) -> Any:
    """The spec plugin ``name`` registered for ``kind`` (``get_plugin_manager().get``); fails the test with the
    manager's message (unknown name, conflict, plugin that failed to load) when there is none."""
    import pytest

    from verl.plugins import PluginError, get_plugin_manager

    try:
        return get_plugin_manager().get(kind, name)
    except PluginError as exc:
        pytest.fail(f"no {kind} {name!r} from the plugin manager: {exc}", pytrace=False)


def build_training_engine(
    spec: Any,
    cfg: Any,
    *,
    model: Any,
    role: str = "actor",
    device: Any = "cpu",
    world_size: int = 1,
    total_training_steps: int = 1,
) -> Any:
    """``spec.factory`` called as the worker calls it for ``role`` (``actor``, ``ref`` or ``critic``), with
    ``options=verl.config.role_options(cfg, role, spec)``."""
    from verl.config import role_options

    return spec.factory(
        cfg,
        role=role,
        model=model,
        options=role_options(cfg, role, spec),
        device=device,
        world_size=world_size,
        total_training_steps=total_training_steps,
    )


def build_rollout_engine(spec: Any, cfg: Any, *, model: Any, tokenizer: Any, device: Any = "cpu") -> Any:
    """``spec.factory`` called as the worker builds the rollout, with ``options=role_options(cfg, "rollout", spec)``."""
    from verl.config import role_options

    return spec.factory(
        cfg, model=model, tokenizer=tokenizer, options=role_options(cfg, "rollout", spec), device=device
    )


def build_checkpoint_engine(spec: Any, cfg: Any, *, platform: Any = None) -> Any:
    """``spec.factory`` called as the worker builds the weight sync, with
    ``options=role_options(cfg, "checkpoint", spec)`` (``platform``: None = the factory's default, cpu)."""
    from verl.config import role_options

    return spec.factory(cfg, options=role_options(cfg, "checkpoint", spec), platform=platform)
