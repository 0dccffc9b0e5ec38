"""The SFT trainer's training engine: any installed training engine (``engine.strategy``), built as the RL actor's.

verl's SFT trainer builds one ``TrainingWorker`` from its ``model``, ``engine`` and ``optim`` sections. Here the SFT
keys are written into an RL run config as the actor's (:func:`actor_run_config`: ``model.*`` as
``actor_rollout_ref.model.*``, ``optim.*`` as ``actor.optim.*``, the rows per step and micro-batch keys as the
actor's ``ppo_*`` keys with ``rollout.n=1``, the flat ``engine.*`` options as ``actor.fsdp_config.*`` or
``actor.megatron.*``), and the engine comes from its plugin's factory with ``role="actor"``
(:func:`build_sft_engine`). So SFT and RL share one engine path and one validation: the engine's options class,
its devices, its ``lora`` capability, verl's key aliases. Errors are reported under the SFT keys
(:func:`sft_key`).

The carrier run config says ``trainer.n_gpus_per_node=1``: it only carries the actor's keys. The engine gets the
real world size (torchrun's ``WORLD_SIZE``) from the trainer, and the SFT trainer checks the batch sizes against
it (:func:`check_world`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from verl.config.errors import ConfigError, ConfigIssue
from verl.config.schema.sft import SFTConfig

#: RL run-config key prefixes -> the SFT key they come from (longest first: the first match wins).
_KEY_MAP: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.actor.engine_kwargs.reference.dtype", "engine.model_dtype"),
    ("actor_rollout_ref.actor.engine_kwargs.reference.", "engine."),
    ("actor_rollout_ref.actor.engine_kwargs.fsdp.", "engine."),
    ("actor_rollout_ref.actor.engine_kwargs.megatron.", "engine."),
    ("actor_rollout_ref.actor.engine_kwargs.reference", "engine"),
    ("actor_rollout_ref.actor.engine_kwargs.fsdp", "engine"),
    ("actor_rollout_ref.actor.engine_kwargs.megatron", "engine"),
    ("actor_rollout_ref.actor.engine_kwargs", "engine"),
    # the options classes' own messages name the section without its prefix
    ("engine_kwargs.reference.dtype", "engine.model_dtype"),
    ("engine_kwargs.reference.", "engine."),
    ("engine_kwargs.fsdp.", "engine."),
    ("engine_kwargs.megatron.", "engine."),
    ("actor_rollout_ref.actor.fsdp_config.", "engine."),
    ("actor_rollout_ref.actor.megatron.", "engine."),
    ("actor_rollout_ref.actor.fsdp_config", "engine"),
    ("actor_rollout_ref.actor.megatron", "engine"),
    ("actor_rollout_ref.actor.strategy", "engine.strategy"),
    ("actor_rollout_ref.actor.optim.", "optim."),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "data.train_batch_size"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "data.micro_batch_size_per_gpu"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "data.max_token_len_per_gpu"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "data.use_dynamic_bsz"),
    ("actor_rollout_ref.model.", "model."),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "data.micro_batch_size_per_gpu"),
    ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "data.max_token_len_per_gpu"),
    ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "data.use_dynamic_bsz"),
    ("actor_rollout_ref.rollout.n", "samples per row"),
)
logger = logging.getLogger(__name__)
_RL_SECTION = {"megatron": "megatron"}  # every other strategy takes verl's fsdp_config section
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: SFT model keys that are the RL actor model's keys of the same name.
_MODEL_KEYS = (
    "path",
    "tokenizer_path",
    "trust_remote_code",
    "use_remove_padding",
    "enable_gradient_checkpointing",
    "override_config",
    "enable_activation_offload",
    "lora_rank",
    "lora_alpha",
    "target_modules",
    "exclude_modules",
    "lora_adapter_path",
)


def sft_key(text: str) -> str:
    """``text`` with every RL run-config key it names rewritten as the SFT key it came from."""
    for rl, sft in _KEY_MAP:
        text = text.replace(rl, sft)
    return text


def _plain(value: Any) -> Any:
    """Config values (tuples, attrs-free dicts) as JSON, which a ``key=value`` override parses back as YAML."""
    return json.dumps(value, default=list)


def actor_run_config(cfg: SFTConfig, *, plugin_manager: Any = None) -> Any:
    """The RL run config whose actor is the SFT run's engine (see the module docstring).

    Returns:
        A validated :class:`verl.config.RootConfig`.

    Raises:
        ConfigError: what the engine or its options refuse (unknown engine, an option it does not know, LoRA on an
            engine without the ``lora`` capability, a device it cannot run on), every issue under its SFT key.
    """
    from verl.config import load_config
    from verl.config.base import schema_base
    from verl.config.dump import to_dict

    d, m, e = cfg.data, cfg.model, cfg.engine
    _check_option_names(cfg, plugin_manager)
    arr = "actor_rollout_ref"
    values: dict[str, Any] = {
        "trainer.device": cfg.trainer.device,
        "trainer.n_gpus_per_node": 1,
        "trainer.controller": "local",
        # No critic: its strategy would follow the actor's and be checked twice.
        "algorithm.adv_estimator": "reinforce_plus_plus",
        "critic.strategy": "reference",
        "data.train_batch_size": d.train_batch_size,
        # An SFT row is the engines' "response" after a one-token "prompt" (verl.data.sft_dataset.collate_sft).
        "data.max_prompt_length": 1,
        "data.max_response_length": max(1, d.max_length - 1),
        f"{arr}.rollout.n": 1,
        f"{arr}.actor.strategy": e.strategy,
        f"{arr}.actor.ppo_mini_batch_size": d.train_batch_size,
        f"{arr}.actor.ppo_micro_batch_size_per_gpu": d.micro_batch_size_per_gpu,
        f"{arr}.actor.use_dynamic_bsz": d.use_dynamic_bsz,
        f"{arr}.actor.ppo_max_token_len_per_gpu": d.max_token_len_per_gpu,
        f"{arr}.actor.ppo_epochs": 1,
        f"{arr}.actor.shuffle": False,
        # No entropy in the SFT loss: nothing for torch.compile to compile.
        f"{arr}.actor.use_torch_compile": False,
        f"{arr}.actor.optim": to_dict(cfg.optim),
        f"{arr}.rollout.log_prob_micro_batch_size_per_gpu": d.micro_batch_size_per_gpu,
        f"{arr}.rollout.log_prob_use_dynamic_bsz": d.use_dynamic_bsz,
        f"{arr}.rollout.log_prob_max_token_len_per_gpu": d.max_token_len_per_gpu,
    }
    for key in _MODEL_KEYS:
        values[f"{arr}.model.{key}"] = getattr(m, key)
    options = dict(e.options)
    if e.model_dtype is not None:
        options["model_dtype"] = _DTYPES[e.model_dtype]
    if options:
        values[f"{arr}.actor.{_RL_SECTION.get(e.strategy, 'fsdp_config')}"] = options
    overrides = [f"{key}={_plain(value)}" for key, value in values.items()]
    try:
        return load_config(
            None,
            overrides,
            base=schema_base("SFT engine"),
            plugin_manager=plugin_manager,
            on_warning=lambda message: logger.warning("%s", sft_key(message)),
        )
    except ConfigError as exc:
        raise ConfigError([ConfigIssue(sft_key(i.key), sft_key(i.message)) for i in exc.issues]) from None


def resolved_strategy(cfg: SFTConfig) -> str:
    """The training engine's name as the plugins know it (verl's ``fsdp2`` is the ``fsdp`` engine here)."""
    return "fsdp" if cfg.engine.strategy == "fsdp2" else cfg.engine.strategy


#: What the one-process engine honours of verl's fsdp_config-style engine keys (verl.config.aliases).
_REFERENCE_OPTIONS = ("model_dtype", "param_offload", "optimizer_offload")


def _check_option_names(cfg: SFTConfig, plugin_manager: Any) -> None:
    """A flat ``engine.<key>`` close to one of the engine's own option names is a typo: say which one was meant
    (the engine's own check would only say the key is not its option)."""
    import difflib

    import attrs

    names: tuple[str, ...]
    if resolved_strategy(cfg) == "reference":
        names = _REFERENCE_OPTIONS
    else:
        try:
            from verl.plugins import get_plugin_manager

            spec = (plugin_manager or get_plugin_manager()).get("training_engine", resolved_strategy(cfg))
        except Exception:  # an unknown engine: the carrier config reports it with the installed names
            return
        cls = getattr(spec, "options_cls", None)
        if cls is None or not attrs.has(cls):
            return
        names = (*(f.name for f in attrs.fields(cls)), "model_dtype")
    issues = []
    for key in cfg.engine.options:
        if key in names:
            continue
        close = difflib.get_close_matches(key, names, n=2, cutoff=0.75)
        if close:
            hint = " or ".join(f"'engine.{c}'" for c in close)
            issues.append(
                ConfigIssue(
                    f"engine.{key}",
                    f"unknown config key 'engine.{key}' of engine.strategy={cfg.engine.strategy}. Did you mean {hint}?",
                )
            )
    if issues:
        raise ConfigError(issues)


def check_world(cfg: SFTConfig, dp_size: int) -> None:
    """The batch sizes against ``dp_size`` data-parallel ranks (verl's SFT rules).

    Raises:
        ConfigError: ``data.train_batch_size`` not a multiple of ``dp_size``, or (without ``use_dynamic_bsz``) a
            per-rank share that ``data.micro_batch_size_per_gpu`` does not divide.
    """
    d = cfg.data
    if d.train_batch_size % dp_size:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} must be a multiple of the {dp_size} data-parallel ranks "
            "(each rank trains an equal share of every step's rows); change it or the number of processes",
            key="data.train_batch_size",
        )
    share = d.train_batch_size // dp_size
    if not d.use_dynamic_bsz and share % d.micro_batch_size_per_gpu:
        raise ConfigError(
            f"data.micro_batch_size_per_gpu={d.micro_batch_size_per_gpu} must divide the {share} rows per "
            f"data-parallel rank (data.train_batch_size={d.train_batch_size} / {dp_size} ranks)",
            key="data.micro_batch_size_per_gpu",
        )


def build_sft_engine(
    cfg: SFTConfig, *, model_path: Any, total_training_steps: int, device: Any, world_size: int
) -> Any:
    """The SFT run's training engine, from ``engine.strategy``'s plugin factory as the RL actor (``role="actor"``).

    Args:
        cfg: the validated SFT config.
        model_path: the resolved model folder.
        total_training_steps: the LR schedule's horizon (the run's step count).
        device: this rank's torch device.
        world_size: processes in the run (torchrun's ``WORLD_SIZE``); the engine's data-parallel size follows from
            it (all of them for fsdp; ``world / (tp x pp x cp)`` for megatron).

    Raises:
        ConfigError: see :func:`actor_run_config`; or several processes for an engine without the
            ``data_parallel`` capability (the one-process ``reference`` engine).
    """
    from verl.config import role_options
    from verl.plugins import get_plugin_manager

    pm = get_plugin_manager()
    run = actor_run_config(cfg, plugin_manager=pm)
    spec = pm.get("training_engine", resolved_strategy(cfg))
    if world_size > 1 and "data_parallel" not in spec.capabilities:
        raise ConfigError(
            f"engine.strategy={cfg.engine.strategy} trains in one process, but torchrun started {world_size} "
            "(WORLD_SIZE); use a data-parallel engine (engine.strategy=fsdp or megatron) or run one process",
            key="engine.strategy",
        )
    try:
        options = role_options(run, "actor", spec)
    except ConfigError as exc:
        raise ConfigError([ConfigIssue(sft_key(i.key), sft_key(i.message)) for i in exc.issues]) from None
    return spec.factory(
        run,
        role="actor",
        model=model_path,
        options=options,
        total_training_steps=total_training_steps,
        device=device,
        world_size=world_size,
    )


def data_parallel(engine: Any, rank: int, world_size: int) -> tuple[int, int, bool]:
    """``(dp_rank, dp_size, is_collect)`` of this rank: the engine's answer (a model-parallel engine's replicas:
    Megatron's ``dispatch_info``), else plain data parallelism over all ranks."""
    info = getattr(engine, "dispatch_info", None)
    if callable(info):
        dp_rank, dp_size, is_collect = info()
        return int(dp_rank), int(dp_size), bool(is_collect)
    return rank, world_size, True
