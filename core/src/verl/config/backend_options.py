"""Checks that need the plugin manager or the algorithm registries (kept apart so tests inject fakes).

* the selected backends exist: ``actor.strategy`` and ``critic.strategy`` (training_engine),
  ``rollout.name`` (rollout_engine), ``rollout.checkpoint_engine.backend`` (checkpoint_engine),
  ``trainer.device`` (platform), and run on an explicitly chosen device: the platform's name or its
  device type (from its spec, no device initialised) is in the engine's ``devices``
  (:func:`verl.plugins.selection.device_mismatch`, the rule ``verl plugins`` and ``verl train`` use);
* each selected role's options (:func:`verl.config.engine_options.role_options`: the critic its own
  ``critic.engine_kwargs.<name>``, the reference policy the actor's overridden by its own when it runs on
  the actor's engine) structure into the plugin's ``options_cls`` (an unknown option is an error naming
  the key where it was written, e.g. ``actor_rollout_ref.rollout.engine_kwargs.vllm.<key>``); a backend
  without an options class takes no options;
* the rollout engine's own check of the first-class rollout keys (``RolloutEngineSpec.check_config``);
* a training engine used on more than one worker declares the ``data_parallel`` capability; a rollout
  engine with ``rollout.tensor_model_parallel_size > 1`` declares ``tensor_parallel``;
* ``algorithm.adv_estimator`` and ``actor.policy_loss.loss_mode`` name registered functions.

When ``verl.plugins`` / ``verl.algorithms`` cannot be imported (e.g. a stripped-down
install), the corresponding checks are skipped and the backend reports the error when built.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.config.engine_options import role_options, selected_roles
from verl.config.errors import ConfigError, IssueCollector
from verl.config.resolve import resolve_config
from verl.config.schema import RootConfig
from verl.config.validate_lora import check_lora_serving

logger = logging.getLogger("verl.config")

ARR = "actor_rollout_ref"


def default_plugin_manager() -> Any | None:
    """The process-wide plugin manager, or None when ``verl.plugins`` is not importable."""
    try:
        from verl.plugins import get_plugin_manager
    except ImportError as exc:
        logger.debug("verl.plugins unavailable, backend options not checked: %s", exc)
        return None
    return get_plugin_manager()


def default_algorithm_registry() -> Any | None:
    """The plugin-aware lookups (:mod:`verl.plugins.algorithm_lookup`: ``get_adv_estimator_fn`` /
    ``get_policy_loss_fn``, local registry then plugins), or None when they cannot be imported."""
    try:
        import verl.algorithms  # noqa: F401  (a stripped-down install without it: nothing to check against)
        from verl.plugins import algorithm_lookup
    except ImportError as exc:
        logger.debug("verl.algorithms / verl.plugins unavailable, estimator/loss names not checked: %s", exc)
        return None
    return algorithm_lookup


def role_data_parallel_size(cfg: RootConfig, role: str, world: int, plugin_manager: Any | None = None) -> int:
    """Data-parallel ranks of ``role`` (``actor`` or ``critic``) on ``world`` training workers.

    ``world`` unless the role's engine splits each model replica over several ranks: its options object answers
    ``model_parallel_size()`` (verl-megatron: tensor x pipeline x context parallel sizes), and the per-rank batch
    keys (``ppo_micro_batch_size_per_gpu``, verl's "per GPU" = per data-parallel rank) then count over
    ``world // model_parallel_size``. Anything that cannot be answered here (no plugin manager, unknown engine,
    bad options, a size not dividing the world) gives ``world``; those are reported by the backend checks.
    """
    pm = plugin_manager if plugin_manager is not None else default_plugin_manager()
    if pm is None:
        return world
    try:
        selection = next(s for s in selected_roles(cfg) if s.role == role)
        options = role_options(cfg, role, pm.get(selection.kind, selection.name))
        size = int(options.model_parallel_size()) if callable(getattr(options, "model_parallel_size", None)) else 1
    except Exception:  # noqa: BLE001  (reported with its reason by validate_backend_options)
        return world
    return world // size if size >= 1 and world % size == 0 else world


def validate_backend_options(cfg: RootConfig, plugin_manager: Any | None = None) -> dict[str, Any]:
    """Check the selected backends and structure their options.

    Args:
        cfg: a config (null follow-values are resolved first).
        plugin_manager: object with ``get(kind, name) -> spec`` (spec has ``options_cls`` and
            ``devices``); None = :func:`default_plugin_manager` (checks skipped if unavailable).

    Returns:
        ``{"<section>.engine_kwargs.<name>": options instance or None}`` for each selected role (the
        reference policy's entry holds its merged options), exactly what :func:`role_options` hands the
        engine factories.

    Raises:
        ConfigError: unknown backend name (with the manager's list of available names),
            device not supported by a backend, unknown/wrong-typed backend option.
    """
    manager = plugin_manager if plugin_manager is not None else default_plugin_manager()
    # A manager exposes get(kind, name) and available(kind) (verl.plugins.PluginManager).
    if manager is None:
        return {}
    cfg = resolve_config(cfg)
    report = IssueCollector()
    try:
        from verl.plugins.selection import device_mismatch, platform_device_type
        from verl.plugins.specs import backend_unavailable
    except ImportError:  # stripped-down install: nothing to ask the specs

        def backend_unavailable(spec: Any) -> str | None:
            return None

        def device_mismatch(kind: str, spec: Any, platform_name: str, device_type: str) -> str | None:
            return None

        def platform_device_type(spec: Any) -> str:
            return str(spec.name)

    device = cfg.trainer.device
    device_type = None  # of the named platform, read from its spec (no device is initialised)
    if device is not None:
        try:
            device_type = platform_device_type(manager.get("platform", device))
        except Exception as exc:
            report.error("trainer.device", str(exc))
    options: dict[str, Any] = {}
    for selection in selected_roles(cfg):
        kind, name_key, name = selection.kind, selection.name_key, selection.name
        try:
            if not manager.available(kind):
                # Nothing of this kind is registered (partial install): no list to check the name against;
                # building the backend reports it.
                logger.debug("no %s registered; %s=%r not checked", kind, name_key, name)
                continue
            spec = manager.get(kind, name)
        except Exception as exc:  # UnknownPluginError / PluginConflictError carry the available names
            report.error(name_key, str(exc))
            continue
        missing = backend_unavailable(spec)
        if missing is not None:
            report.error(name_key, f"{kind.replace('_', ' ')} {name!r} is installed but cannot run here: {missing}")
            continue
        # One rule with `verl train` and `verl plugins`: the platform's name or device type is in `devices`.
        problem = device_mismatch(kind, spec, device, device_type) if device_type is not None else None
        if problem is not None:
            report.error(name_key, problem)
        world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
        capabilities = frozenset(getattr(spec, "capabilities", ()) or ())
        if kind == "training_engine" and world > 1 and "data_parallel" not in capabilities:
            report.error(
                name_key,
                f"training engine {name!r} runs in a single process and cannot train on {world} workers "
                "(trainer.nnodes x trainer.n_gpus_per_node); use a data-parallel engine such as "
                f"{name_key}=fsdp (from the verl checkout: pip install ./plugins/verl-fsdp) "
                "or set trainer.n_gpus_per_node=1",
            )
        lora_rank = cfg.actor_rollout_ref.model.lora_rank
        if kind == "training_engine" and selection.role == "actor" and lora_rank > 0 and "lora" not in capabilities:
            report.error(
                f"{ARR}.model.lora_rank",
                f"={lora_rank}, but training engine {name!r} cannot train LoRA adapters (capability 'lora'); use "
                f"{name_key}=reference or fsdp, or set lora_rank=0",
            )
        if kind == "rollout_engine":
            check_lora_serving(cfg, name, capabilities, report)
        tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
        if kind == "rollout_engine" and tp > 1 and "tensor_parallel" not in capabilities:
            report.error(
                f"{ARR}.rollout.tensor_model_parallel_size",
                f"={tp}, but rollout engine {name!r} does not declare tensor parallelism (capability "
                "'tensor_parallel'); use tensor_model_parallel_size=1 or a rollout engine that splits the model "
                "(hf, vllm)",
            )
        if (
            kind == "rollout_engine"
            and cfg.actor_rollout_ref.rollout.mode == "async"
            and ("async_server" not in capabilities)
        ):
            report.error(
                f"{ARR}.rollout.mode",
                f"=async runs agent loops against the rollout engine's server, but rollout engine {name!r} does not "
                "declare one (capability 'async_server'); use mode=sync or a serving engine (hf, vllm)",
            )
        check = getattr(spec, "check_config", None) if kind == "rollout_engine" else None
        for key, message in _run_check_config(check, cfg) if check is not None else ():
            report.error(key, message)
        try:
            # The one rule the workers use too (verl.config.engine_options): what is checked is what engines get.
            options[selection.options_key] = role_options(cfg, selection.role, spec)
        except ConfigError as exc:
            # A value the reference policy inherited is reported at the actor's key, once.
            report.errors.extend(issue for issue in exc.issues if issue not in report.errors)
    _check_agent_loops(cfg, manager, report)
    report.raise_if_errors()
    return options


def _check_agent_loops(cfg: RootConfig, manager: Any, report: IssueCollector) -> None:
    """``rollout.agent.default_agent_loop`` names an installed agent loop (plugins + the config file)."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.mode != "async" or not manager.available("agent_loop"):
        return  # sync mode reads no agent loop; a manager without the kind (a stripped test fake) cannot tell
    from verl.agents.registry import agent_loop_factories

    try:
        loops = agent_loop_factories(rollout.agent, manager)
    except ValueError as exc:
        if "already provided" in str(exc):  # a bad file itself is validate_agents' error, reported once there
            report.error(f"{ARR}.rollout.agent.agent_loop_config_path", str(exc))
        return
    if rollout.agent.default_agent_loop not in loops:
        report.error(
            f"{ARR}.rollout.agent.default_agent_loop",
            f"={rollout.agent.default_agent_loop!r} is not an installed agent loop; known: {sorted(loops)}",
        )


def _run_check_config(check: Any, cfg: RootConfig) -> Any:
    """A rollout spec's ``check_config`` on the rollout section, with the whole config as ``root=`` when the
    function takes that keyword (plugin API 2.3: placement rules need ``trainer``)."""
    import inspect

    try:
        takes_root = "root" in inspect.signature(check).parameters
    except (TypeError, ValueError):  # a builtin or C callable: the 2.0 signature
        takes_root = False
    rollout = cfg.actor_rollout_ref.rollout
    return check(rollout, root=cfg) if takes_root else check(rollout)


def validate_registered_names(cfg: RootConfig, registry: Any | None = None) -> None:
    """``algorithm.adv_estimator`` and ``actor.policy_loss.loss_mode`` must be registered.

    Args:
        registry: object with ``get_adv_estimator_fn(name)`` and ``get_policy_loss_fn(name)``
            that raise on unknown names; None = :func:`default_algorithm_registry` (skipped if not importable).

    Raises:
        ConfigError: naming the key and quoting the registry's message (which lists the registered names).
    """
    registry = registry if registry is not None else default_algorithm_registry()
    if registry is None:
        return
    report = IssueCollector()
    for key, name, lookup, what in (
        ("algorithm.adv_estimator", cfg.algorithm.adv_estimator, "get_adv_estimator_fn", "advantage estimator"),
        (
            f"{ARR}.actor.policy_loss.loss_mode",
            cfg.actor_rollout_ref.actor.policy_loss.loss_mode,
            "get_policy_loss_fn",
            "policy loss",
        ),
    ):
        fn = getattr(registry, lookup, None)
        if fn is None:  # registry without this lookup (older/partial install): nothing to check against
            continue
        try:
            fn(name)
        except Exception as exc:
            text = str(exc)
            # The registry's own message names the value and lists the known names; say it once.
            report.error(key, text if repr(name) in text else f"{name!r} is not a registered {what}: {text}")
    report.raise_if_errors()
