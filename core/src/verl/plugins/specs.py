"""Spec records: what a plugin hands to verl through the hooks of :mod:`verl.plugins.hookspecs`.

Each record is a frozen, keyword-only attrs class describing one named thing a plugin provides.
Records are cheap to build: they hold callables (``probe``, ``factory``, ``fn``) that import
heavy backends (vllm, torch_npu, megatron, ...) only when *called*, so listing plugins
(``verl plugins``) never imports a backend.

Fields are validated at construction; a bad record raises ``TypeError``/``ValueError`` inside the
plugin's hook, which the manager records as a failure of that plugin (with its distribution).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from verl.plugins.factories import (
    CheckpointEngineFactory,
    PlatformFactory,
    RolloutEngineFactory,
    TrainingEngineFactory,
)

if TYPE_CHECKING:
    from verl.platform.base import ProbeResult

# Names are config values (``actor_rollout_ref.rollout.name=vllm``) and config keys
# (``engine_kwargs.vllm.*``), so no dots, spaces or leading digits.
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*\Z")


def _check_name(owner: str, value: object) -> str:
    """Return ``value`` if it is a valid plugin name, else raise naming ``owner``.

    Raises:
        TypeError: ``value`` is not a ``str``.
        ValueError: empty, or not letters/digits/``_``/``-`` starting with a letter.
    """
    if not isinstance(value, str):
        raise TypeError(f"{owner}.name must be a str, got {type(value).__name__} ({value!r})")
    if not _NAME_RE.match(value):
        raise ValueError(
            f"{owner}.name={value!r} is not a valid name: use letters, digits, '_' or '-', "
            "starting with a letter (e.g. 'vllm', 'grpo_passk')"
        )
    return value


def _name(inst: object, attribute: attrs.Attribute, value: object) -> None:
    _check_name(type(inst).__name__, value)


def _callable(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{type(inst).__name__}.{attribute.name} must be callable, got {type(value).__name__}")


def _options_cls(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None:
        return
    if not (isinstance(value, type) and (attrs.has(value) or dataclasses.is_dataclass(value))):
        raise TypeError(
            f"{type(inst).__name__}.options_cls must be an attrs class (or dataclass) or None, got {value!r}"
        )


def _as_tuple(value: Any) -> Any:
    # A bare string is left alone so the validator can reject it ("cuda" is not ("c","u","d","a")).
    return tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else value


def _as_frozenset(value: Any) -> Any:
    return frozenset(value) if isinstance(value, (list, tuple, set, frozenset)) else value


def _str_collection(empty_ok: bool) -> Callable[[object, attrs.Attribute, object], None]:
    def check(inst: object, attribute: attrs.Attribute, value: object) -> None:
        owner = f"{type(inst).__name__}.{attribute.name}"
        if not isinstance(value, (tuple, frozenset)):
            raise TypeError(f"{owner} must be a list/tuple/set of str, got {type(value).__name__} ({value!r})")
        if not value and not empty_ok:
            raise ValueError(f"{owner} must name at least one device type, e.g. ('cpu', 'cuda')")
        bad = [v for v in value if not isinstance(v, str) or not v]
        if bad:
            raise TypeError(f"{owner} must hold non-empty strings, got {bad!r}")

    return check


_DEFAULT_DEVICES = ("cpu", "cuda")


def _device_type(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise TypeError(
            f"{type(inst).__name__}.device_type must be a torch device type such as 'cpu', 'cuda' or 'npu' "
            f"(or None to derive it), got {value!r}"
        )


def _alias(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise TypeError(f"{type(inst).__name__}.alias_of must be a platform name such as 'cuda' or None, got {value!r}")
    if value == getattr(inst, "name", None):
        raise ValueError(f"{type(inst).__name__}.alias_of={value!r} names the platform itself")


@attrs.frozen(kw_only=True)
class PlatformSpec:
    """A device platform (returned by ``verl_platforms``).

    Attributes:
        name: what users put in ``trainer.device`` (``"cpu"``, ``"cuda"``, ``"npu"``).
        probe: zero-argument, cheap (no device initialisation, fork-safe) availability check.
            Returns ``bool`` or a :class:`verl.platform.ProbeResult` (truthy/falsy plus a
            ``reason`` shown to users). Exceptions are caught and reported as "not available".
        factory: :class:`~verl.plugins.factories.PlatformFactory`, a zero-argument callable
            returning a :class:`verl.platform.Platform`; called only for the chosen platform.
        accelerator: ``True`` for devices that take part in automatic selection; ``False``
            for the fallback (``cpu``).
        device_type: the torch device type of the platform the factory builds (``"cuda"`` for
            ``rocm``, ``"cpu"`` for a platform whose tensors live in host memory). Engine specs'
            ``devices`` are matched against it (and against ``name``) when the config is loaded,
            without building the platform. ``None`` (the default) derives it: the factory's
            ``device_type`` class attribute when the factory is a ``Platform`` subclass, else
            ``name``. After construction it is always a ``str``; the platform the factory returns
            must have this device type (checked when it is built).
        alias_of: another platform name this one is an explicit-only alias of (``rocm`` is an alias
            of ``cuda``: on an AMD machine both answer yes and build the same platform). An alias is
            selectable by ``trainer.device=<name>`` but left out of the automatic choice, so one
            device is never counted twice. ``None``: not an alias.
    """

    KIND: ClassVar[str] = "platform"

    name: str = attrs.field(validator=_name)
    probe: Callable[[], bool | ProbeResult] = attrs.field(validator=_callable)
    factory: PlatformFactory = attrs.field(validator=_callable)
    accelerator: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    device_type: str | None = attrs.field(default=None, validator=attrs.validators.optional(_device_type))
    alias_of: str | None = attrs.field(default=None, validator=attrs.validators.optional(_alias))

    def __attrs_post_init__(self) -> None:
        if self.device_type is None:
            # Frozen record: the derived value is set once, here, so every reader sees a str.
            object.__setattr__(self, "device_type", derived_device_type(self.name, self.factory))


def derived_device_type(name: str, factory: object) -> str:
    """The device type of a platform spec that does not declare one: ``factory.device_type`` when the
    factory is a class with a ``str`` ``device_type`` (a ``Platform`` subclass), else ``name``.

    Never calls the factory (config load must not initialise a device)."""
    declared = getattr(factory, "device_type", None) if isinstance(factory, type) else None
    return declared if isinstance(declared, str) and declared else name


@attrs.frozen(kw_only=True)
class _BackendSpec:
    """Fields shared by the engine specs (not a kind itself).

    ``available``: optional zero-argument, cheap check that the backend's own dependencies are
    installed (e.g. ``importlib.util.find_spec("vllm")``; never import heavy modules here). It returns
    ``True``, or a string saying what is missing and how to install it; ``verl plugins`` shows it and
    the config check refuses the backend with it. ``None``: always available.
    """

    name: str = attrs.field(validator=_name)
    # Typed per kind in the subclasses (verl.plugins.factories); here the common validator.
    factory: Any = attrs.field(validator=_callable)
    options_cls: type | None = attrs.field(default=None, validator=_options_cls)
    devices: tuple[str, ...] = attrs.field(
        default=_DEFAULT_DEVICES, converter=_as_tuple, validator=_str_collection(False)
    )
    available: Callable[[], bool | str] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )


def backend_unavailable(spec: Any) -> str | None:
    """Why ``spec``'s backend cannot be used here (its ``available()`` answer), or ``None`` if it can.

    An ``available`` that raises counts as unavailable, with the exception as the reason.
    """
    check = getattr(spec, "available", None)
    if check is None:
        return None
    try:
        answer = check()
    except Exception as exc:  # a broken probe must not break listing or config loading
        return f"availability check failed: {type(exc).__name__}: {exc}"
    if answer is True:
        return None
    return str(answer) if isinstance(answer, str) and answer else f"{spec.name!r} reports it is not available"


@attrs.frozen(kw_only=True)
class TrainingEngineSpec(_BackendSpec):
    """A training engine backend (returned by ``verl_training_engines``).

    Attributes:
        name: the engine's name in config (``"fsdp"``, ``"megatron"``, ``"reference"``).
        factory: :class:`~verl.plugins.factories.TrainingEngineFactory`, ``factory(config, *, role,
            model, options, device, world_size, total_training_steps=1)`` building a
            :class:`verl.engines.TrainingEngine`; imports the backend only when called.
        options_cls: attrs class (or dataclass) of the backend's own options, validated when the
            config is loaded and handed to the factory as ``options`` (one instance per role:
            :func:`verl.config.role_options`), or ``None`` (the factory gets ``options=None``).
        devices: where it runs, normally torch device types (default ``("cpu", "cuda")``): a
            platform matches when its ``device_type`` *or* its ``name`` is listed
            (:func:`verl.plugins.selection.engine_runs_on`, the one rule of config load, ``verl
            train`` and ``verl plugins``). ``"cuda"`` covers ROCm (device type ``cuda``) and a
            vendor platform whose tensors are ``cuda`` tensors; ``"cpu"`` covers any platform with
            device type ``cpu``. List a platform *name* only to restrict an engine to one platform
            of a shared device type.
        capabilities: feature flags (``{"lora", "offload"}``) checked at config load;
            ``data_parallel`` (may train on more than one worker), ``share_module`` (a rollout
            engine may generate from its live module), ``lora`` (trains peft LoRA adapters when
            ``model.lora_rank > 0``; an engine without it is refused at config load).
        merge_checkpoint: ``merge_checkpoint(actor_folder, hf_source, out_folder) -> Path``, used
            by ``verl export``: one process turns an actor checkpoint this engine wrote (any
            world size) into a HF folder; ``hf_source`` holds the model's config and tokenizer.
            ``None``: the engine's checkpoints cannot be exported.
    """

    KIND: ClassVar[str] = "training_engine"

    factory: TrainingEngineFactory = attrs.field(validator=_callable)
    capabilities: frozenset[str] = attrs.field(
        factory=frozenset, converter=_as_frozenset, validator=_str_collection(True)
    )
    merge_checkpoint: Callable[..., Any] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable())
    )


@attrs.frozen(kw_only=True)
class RolloutEngineSpec(_BackendSpec):
    """A rollout (generation) engine backend (returned by ``verl_rollout_engines``).

    Same fields as :class:`TrainingEngineSpec`; ``name`` is ``actor_rollout_ref.rollout.name``
    (``"vllm"``, ``"sglang"``, ``"hf"``), ``factory`` is a
    :class:`~verl.plugins.factories.RolloutEngineFactory`, ``factory(config, *, model, tokenizer, options,
    device)`` building a :class:`verl.engines.RolloutEngine`.

    ``check_config``: optional ``f(rollout_config) -> [(dotted key, message), ...]``, run when the config is
    loaded: the first-class rollout keys (``gpu_memory_utilization``, ``enforce_eager``, ...) this backend
    cannot honour, or honours only in some range. Cheap and import-light, like ``available``. Since plugin API
    2.3 a function with a ``root`` keyword parameter (``f(rollout_config, *, root)``) also gets the whole
    :class:`verl.config.RootConfig`, for rules on other sections (the trainer's placement).
    """

    KIND: ClassVar[str] = "rollout_engine"

    factory: RolloutEngineFactory = attrs.field(validator=_callable)
    capabilities: frozenset[str] = attrs.field(
        factory=frozenset, converter=_as_frozenset, validator=_str_collection(True)
    )
    check_config: Callable[[Any], Any] | None = attrs.field(
        default=None, validator=attrs.validators.optional(_callable)
    )


@attrs.frozen(kw_only=True)
class CheckpointEngineSpec(_BackendSpec):
    """A weight-sync engine trainer -> rollout (returned by ``verl_checkpoint_engines``).

    Fields ``name`` (``"colocated"``, ``"broadcast"``), ``factory`` (a
    :class:`~verl.plugins.factories.CheckpointEngineFactory`, ``factory(config, *, options, platform)``
    building a :class:`verl.engines.CheckpointEngine`), ``options_cls`` and ``devices`` as for
    :class:`TrainingEngineSpec`.
    """

    KIND: ClassVar[str] = "checkpoint_engine"

    factory: CheckpointEngineFactory = attrs.field(validator=_callable)


@attrs.frozen(kw_only=True)
class AdvantageEstimatorSpec:
    """An advantage estimator (returned by ``verl_advantage_estimators``).

    Attributes: ``name`` (value of ``algorithm.adv_estimator``), ``fn`` with verl's
    ``core_algos`` keyword signature for estimators (see :mod:`verl.algorithms`).
    """

    KIND: ClassVar[str] = "advantage_estimator"

    name: str = attrs.field(validator=_name)
    fn: Callable[..., Any] = attrs.field(validator=_callable)


@attrs.frozen(kw_only=True)
class PolicyLossSpec:
    """A policy loss (returned by ``verl_policy_losses``).

    Attributes: ``name`` (value of ``actor_rollout_ref.actor.policy_loss.loss_mode``), ``fn``
    with verl's ``core_algos`` policy-loss keyword signature (see :mod:`verl.algorithms`).
    """

    KIND: ClassVar[str] = "policy_loss"

    name: str = attrs.field(validator=_name)
    fn: Callable[..., Any] = attrs.field(validator=_callable)


@attrs.frozen(kw_only=True)
class AgentLoopSpec:
    """An agent loop (returned by ``verl_agent_loops``), run per sample by ``rollout.mode=async``.

    Attributes: ``name`` (a dataset row's ``agent_name``, or ``rollout.agent.default_agent_loop``), ``factory``
    (usually the :class:`verl.agents.AgentLoopBase` subclass itself): ``factory(context)`` with a
    :class:`verl.agents.AgentLoopContext` builds a loop whose ``async run(sampling_params, **sample)`` returns a
    :class:`verl.agents.AgentLoopOutput` (verl's ``@register(name)`` agent loops).
    """

    KIND: ClassVar[str] = "agent_loop"

    name: str = attrs.field(validator=_name)
    factory: Callable[..., Any] = attrs.field(validator=_callable)


Spec = (
    PlatformSpec
    | TrainingEngineSpec
    | RolloutEngineSpec
    | CheckpointEngineSpec
    | AdvantageEstimatorSpec
    | PolicyLossSpec
    | AgentLoopSpec
)

#: kind -> spec record class, in the order ``verl plugins`` prints them.
SPEC_TYPES: dict[str, type] = {
    cls.KIND: cls
    for cls in (
        PlatformSpec,
        TrainingEngineSpec,
        RolloutEngineSpec,
        CheckpointEngineSpec,
        AdvantageEstimatorSpec,
        PolicyLossSpec,
        AgentLoopSpec,
    )
}

#: The kinds a plugin can provide.
KINDS: tuple[str, ...] = tuple(SPEC_TYPES)
