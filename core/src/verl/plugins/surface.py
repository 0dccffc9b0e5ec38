"""What ``VERL_PLUGIN_API`` promises: the core names a plugin may import.

A plugin declares ``VERL_PLUGIN_API = (major, minor)``; core refuses a different major or a newer minor
(:func:`verl.plugins.discovery.check_api_version`). That check only means something if the API it
versions is written down. :data:`PLUGIN_API_SURFACE` is that list: the modules and names of verl-core a
plugin may import and rely on across releases serving the same major version. Everything else in core is
internal and may change in any release.

The rules that come with the list:

* Removing a name, or changing its signature or behaviour incompatibly, bumps the major version.
* Adding a name (or a keyword argument with a default) bumps the minor version; a plugin that needs it
  declares the new minor, and an older core refuses it with "upgrade verl-core".
* 2.0: engine factories receive the validated options. A factory takes the required keyword ``options`` (the
  role's ``engine_kwargs.<name>`` structured into the spec's ``options_cls`` at config load by
  :func:`verl.config.role_options`, or None) and never reads ``engine_kwargs`` itself; the signatures are the
  Protocols of :mod:`verl.plugins.factories`. A 1.x plugin is refused with what changed.
* 2.1 (minor: names added, nothing changed): ``verl.engines.reference.builders``'s
  ``build_reference_training_engine``, ``build_hf_rollout_engine`` and the options classes
  ``ReferenceEngineOptions`` and ``HFRolloutOptions`` (the ``reference`` and ``hf`` specs' factories and
  ``options_cls``), next to ``role_settings``, and ``verl.engines.reference.export.merge_reference_checkpoint``
  (the ``reference`` spec's ``merge_checkpoint``): a backend that delegates to a built-in engine or subclasses
  ``ReferenceTrainingEngine`` builds and exports it the way core does. A plugin using them declares
  ``(2, 1)``; one declaring ``(2, 0)`` is still accepted. Also added in 2.1, because the plugin guides' examples
  import them: ``verl.algorithms``'s ``agg_loss``, ``masked_mean``, ``compute_global_batch_info`` and
  ``verl.algorithms.loss_agg.split_global_batch_info`` (a policy loss), ``verl.plugins.resolve_platform`` and
  ``verl.engines.reference.rollout.HFRolloutEngine`` (a vendor's oracle test), ``verl.plugins.PluginManager``
  and ``reset_plugin_manager`` (a plugin's unit tests).
* 2.2 (minor: names added): ``verl.config.ConfigIssue`` (a factory's config error naming its key), and the
  batch helpers every training engine needs to follow the reference engine's semantics:
  ``verl.engines.micro_batch``'s ``fixed_size_plan``, ``token_budget_plan``, ``restore_order``,
  ``mini_batch_schedule`` and
  ``verl.engines.optim``'s ``build_optimizer``, ``build_lr_scheduler`` (verl-megatron uses them).
* 2.3 (minor: names added): ``verl.engines.weight_sync.names``, the checks on a weight update bound for a
  rollout engine that loads its own copy of the checkpoint (names, shapes, fused groups, tied head) and the
  bucketing that never splits a fused group, and ``verl.engines.prompts``'s ``strip_left_padding``,
  ``row_seeds``, ``eos_token_ids``, the per-row inputs of a token-in engine (verl-vllm, verl-sglang, verl-trtllm
  share them). A rollout spec's ``check_config`` that takes a ``root`` keyword also gets the whole config.
* 2.4 (minor: a kind and names added): the ``agent_loop`` kind (hook ``verl_agent_loops``, record
  ``AgentLoopSpec``) and what an agent loop, a tool or an interaction plugin builds on: ``verl.agents``'s
  ``AgentLoopBase``, ``AgentLoopContext``, ``AgentLoopOutput``, ``turn_seed``, ``verl.agents.chat``'s
  ``prompt_ids`` / ``message_ids``, ``verl.agents.tool_parser``'s ``ToolParser``, ``FunctionCall``,
  ``ParsedTurn``, ``verl.tools``' ``BaseTool``, ``ToolResponse``, ``ToolSchema``,
  ``verl.interactions.base.BaseInteraction``, and ``verl.engines.serving`` (``TokenOutput``,
  ``AsyncRolloutServer``, ``check_sampling_params``) for a rollout engine that serves ``rollout.mode=async``.
* 2.5 (minor: a name added): ``verl.config.serves_lora_adapters``, whether a rollout engine with the
  ``lora_adapters`` capability is to serve the actor's LoRA as an adapter (``model.lora.merge``, placement, device);
  such an engine has ``serves_lora_adapters`` and ``load_lora_adapter(tensors, config)`` (docs/lora.md).
* 2.6 (minor: names added): ``verl.engines.serving.validate_request``, ``ValidRequest`` and ``RequestError``: the
  field-by-field check of an async server request that every rollout server calls before generating;
  ``verl.platform.network`` (``join_default_group``, ``init_process_group``, ``tcp_store``, ``free_port``, ...):
  process groups and stores whose sockets listen on loopback unless the group spans nodes; and the keyword
  ``host`` of :meth:`Platform.new_sync_group` (the address the group's own sockets bind; a platform overriding the
  method should accept and pass it on: one that does not is still called without it); ``verl.engines.safe_files``
  (a checkpoint's data-only readers and writers, the non-finite check and the checkpoint errors), for an engine
  that saves its own files, and ``verl.engines.safe_dcp`` (``torch.distributed.checkpoint`` files read without
  unpickling objects: the metadata allow-list reader, the weights-only value planner mixin; verl-fsdp and
  verl-megatron use it); an engine may answer the workers' non-finite check with ``nonfinite_state()``; and
  ``verl.tools.code_interpreter.CodeInterpreterTool`` and ``verl.tools.sandbox``'s ``run_python`` /
  ``SandboxLimits`` / ``RunResult``: the box for model-written code, for a tool or scorer that runs it.
* The engine base classes listed here (``ReferenceTrainingEngine``, ``ReferenceCriticEngine``,
  ``EngineSettings``) are extension points: a backend may subclass them and override the documented
  hooks (see their docstrings). Private attributes (``_name``) are not part of the promise.

The in-repo plugins (``plugins/*``) are held to the list by ``core/tests/plugins/test_plugin_api_surface.py``:
importing anything else from ``verl`` fails that test, so the list cannot silently drift from what the
plugins actually use. Since core is still ``0.x``, the in-repo plugins also pin the core minor they were
released with (``verl-core>=0.1,<0.2``).
"""

from __future__ import annotations

import importlib

#: ``{module: (names, ...)}`` that plugins may import under plugin API 2.x. ``"*"`` means the module itself
#: (``import verl.protocol``).
PLUGIN_API_SURFACE: dict[str, tuple[str, ...]] = {
    # Registration: the hook marker, the spec records and the API version to declare.
    "verl.plugins": (
        "hookimpl",
        "PLUGIN_API_VERSION",
        "PlatformSpec",
        "TrainingEngineSpec",
        "RolloutEngineSpec",
        "CheckpointEngineSpec",
        "AdvantageEstimatorSpec",
        "PolicyLossSpec",
        "AgentLoopSpec",  # 2.4
        "get_plugin_manager",
        "PluginError",
        "UnknownPluginError",
        # 2.1: the platform a test or tool runs on, chosen by core's rule (trainer.device or automatic), and
        # what a plugin's unit tests register it with (docs/plugin-authors.md, "Testing a plugin").
        "resolve_platform",
        "PluginManager",
        "reset_plugin_manager",
    ),
    "verl.plugins.hookspecs": ("hookimpl",),
    # The factory signatures (2.0): what the specs' factory callables are called with.
    "verl.plugins.factories": (
        "TrainingEngineFactory",
        "RolloutEngineFactory",
        "CheckpointEngineFactory",
        "PlatformFactory",
    ),
    # A factory's options as the worker builds them (tests call the factory the same way).
    "verl.config": ("ConfigError", "load_config", "role_options", "ConfigIssue", "serves_lora_adapters"),  # 2.5
    # 2.2: micro-batch plans and the optimizer / LR schedule of the reference engine (an engine that is not a
    # ReferenceTrainingEngine subclass keeps its semantics with these).
    "verl.engines.micro_batch": ("fixed_size_plan", "token_budget_plan", "restore_order", "mini_batch_schedule"),
    "verl.engines.optim": ("build_optimizer", "build_lr_scheduler"),
    "verl.plugins.discovery": ("PLUGIN_API_VERSION",),
    "verl.plugins.specs": (
        "PlatformSpec",
        "TrainingEngineSpec",
        "RolloutEngineSpec",
        "CheckpointEngineSpec",
        "AdvantageEstimatorSpec",
        "PolicyLossSpec",
    ),
    # 2.1: what a policy loss needs to aggregate like core's (docs/plugin-authors.md, "A policy loss").
    "verl.algorithms": ("agg_loss", "masked_mean", "compute_global_batch_info"),
    "verl.algorithms.loss_agg": ("split_global_batch_info",),
    # Device platforms.
    "verl.platform": ("Platform", "ProbeResult"),
    "verl.platform.base": ("Platform", "ProbeResult", "UnsupportedBackendError"),
    # The batch type and the engine protocols.
    "verl.protocol": ("DataProto",),
    "verl.engines.base": ("TrainingEngine", "RolloutEngine", "CheckpointEngine", "LossFn", "wake_up_tagged"),
    # Helpers every backend needs to read verl's config the way core does.
    "verl.engines.dtypes": ("resolve_dtype",),
    # 2.3: the per-row inputs of a token-in engine (vLLM, SGLang, TensorRT-LLM share them).
    "verl.engines.prompts": ("check_prompt_batch", "strip_left_padding", "row_seeds", "eos_token_ids"),
    "verl.models": ("load_tokenizer", "resolve_model_path"),
    "verl.models.hf_config": ("load_hf_config", "split_override_config"),
    # Extension points of the reference engines (subclassed by verl-fsdp) and the rollout output layout.
    # 2.1: the built-in engines' factories and options classes, which a backend wrapping or subclassing them
    # calls (a rollout delegating to ``hf``, a training engine on ReferenceTrainingEngine).
    "verl.engines.reference.builders": (
        "role_settings",
        "build_reference_training_engine",
        "build_hf_rollout_engine",
        "ReferenceEngineOptions",
        "HFRolloutOptions",
    ),
    # 2.1: ``verl export`` of an engine that writes the reference engine's checkpoint files.
    "verl.engines.reference.export": ("merge_reference_checkpoint",),
    "verl.engines.reference.training": ("EngineSettings", "ReferenceTrainingEngine"),
    "verl.engines.reference.critic": ("ReferenceCriticEngine",),
    # 2.1: the reference rollout, the numerical oracle a device is compared with (docs/platform-vendors.md).
    "verl.engines.reference.rollout": ("HFRolloutEngine",),
    "verl.engines.reference.postprocess": ("build_rollout_batch",),
    "verl.engines.reference.sampling": ("SamplingParams", "resolve_sampling_params"),
    # Weight sync: tensor-parallel layouts and resharding (hybrid engine), sync-group helpers.
    "verl.engines.weight_sync.group": ("free_port",),
    "verl.platform.network": ("*",),
    "verl.engines.safe_files": ("*",),
    "verl.tools.code_interpreter": ("CodeInterpreterTool",),
    "verl.tools.sandbox": ("run_python", "SandboxLimits", "RunResult"),
    "verl.engines.safe_dcp": ("*",),
    "verl.engines.weight_sync.layout": ("TP_KEY", "TensorParallelLayout", "divisors", "local_shape"),
    "verl.engines.weight_sync.reshard": ("dedupe_tied", "reshard_weights"),
    # 2.3: checks on an update for an engine that loads its own checkpoint copy (vLLM, SGLang, TensorRT-LLM).
    "verl.engines.weight_sync.names": (
        "UnknownWeightError",
        "FUSED_GROUPS",
        "checkpoint_shapes",
        "tied_embeddings",
        "fused_group",
        "check_specs",
        "check_update",
        "update_buckets",
    ),
    # 2.4: agent loops, tools and interactions (rollout.mode=async), and the server contract of a serving engine.
    "verl.agents": ("AgentLoopBase", "AgentLoopContext", "AgentLoopOutput", "turn_seed"),
    "verl.agents.chat": ("prompt_ids", "message_ids"),
    "verl.agents.tool_parser": ("ToolParser", "FunctionCall", "ParsedTurn"),
    "verl.tools": ("BaseTool", "ToolResponse", "ToolSchema"),
    "verl.interactions.base": ("BaseInteraction",),
    "verl.engines.serving": (
        "TokenOutput",
        "AsyncRolloutServer",
        "StopReason",
        "SAMPLING_KEYS",
        "check_sampling_params",
        "validate_request",
        "ValidRequest",
        "RequestError",
    ),
    # Conformance kits (test code: needs verl-core[testing]).
    "verl.testing.conformance": ("*",),
    "verl.testing.tiny": ("*",),
}


def missing_names() -> list[str]:
    """``["module.name", ...]`` listed in :data:`PLUGIN_API_SURFACE` that core does not define (should be empty).

    Imports every listed module (torch included); meant for tests and ``verl plugins --check-api`` style tools.
    """
    missing = []
    for module_name, names in PLUGIN_API_SURFACE.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name} (import failed: {exc})")
            continue
        missing += [f"{module_name}.{name}" for name in names if name != "*" and not hasattr(module, name)]
    return missing


def allowed(module: str, name: str | None) -> bool:
    """Whether importing ``name`` from ``module`` (``None``: the module itself) is within the API surface.

    Submodules of a ``"*"`` module are allowed too (``verl.testing.conformance.checks``).
    """
    for listed, names in PLUGIN_API_SURFACE.items():
        if "*" in names and (module == listed or module.startswith(listed + ".")):
            return True
        if module == listed and (name is None or name in names):
            return True
    return False
