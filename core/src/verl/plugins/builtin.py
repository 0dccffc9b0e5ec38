"""Core's own plugin: the ``cpu``, ``cuda`` and ``rocm`` platforms and the algorithms of :mod:`verl.algorithms`.

Registered through the public entry-point group (``builtin = "verl.plugins.builtin"`` in
verl-core's ``pyproject.toml``), so core exercises the same path as third-party plugins. It is
always loaded, whatever ``VERL_PLUGINS`` says. Heavy imports happen inside the hooks.
"""

from __future__ import annotations

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import AdvantageEstimatorSpec, AgentLoopSpec, PlatformSpec, PolicyLossSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION


@hookimpl
def verl_platforms() -> list[PlatformSpec]:
    """``cpu`` (the fallback, always available), ``cuda`` (NVIDIA CUDA or AMD ROCm) and ``rocm`` (AMD ROCm
    only, an explicit-only alias of ``cuda``)."""
    from verl.platform.cpu import CpuPlatform
    from verl.platform.cuda import RocmPlatform, make_cuda_platform, probe_cuda, probe_rocm

    return [
        PlatformSpec(name="cpu", probe=CpuPlatform.probe, factory=CpuPlatform, accelerator=False),
        # The factory is a function (CUDA or ROCm class), so the device type is declared, not derived.
        PlatformSpec(name="cuda", probe=probe_cuda, factory=make_cuda_platform, device_type="cuda"),
        # trainer.device=rocm: yes only on a ROCm build; an alias, so an AMD box has one automatic candidate.
        PlatformSpec(name="rocm", probe=probe_rocm, factory=RocmPlatform, alias_of="cuda"),
    ]


@hookimpl
def verl_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    """Every estimator registered with ``verl.algorithms.register_adv_est`` (gae, grpo, rloo, ...)."""
    from verl.algorithms.registry import ADV_ESTIMATOR_REGISTRY

    return [AdvantageEstimatorSpec(name=name, fn=fn) for name, fn in ADV_ESTIMATOR_REGISTRY.items()]


@hookimpl
def verl_policy_losses() -> list[PolicyLossSpec]:
    """Every loss registered with ``verl.algorithms.register_policy_loss`` (vanilla, gspo, ...)."""
    from verl.algorithms.registry import POLICY_LOSS_REGISTRY

    return [PolicyLossSpec(name=name, fn=fn) for name, fn in POLICY_LOSS_REGISTRY.items()]


@hookimpl
def verl_training_engines() -> list:
    """``reference``: single-process PyTorch on a HF causal LM (the CPU default and numerical oracle).

    Capability ``share_module`` (a rollout may generate from its live module); no ``data_parallel``:
    it runs on one worker only.
    """
    from verl.engines.reference.builders import ReferenceEngineOptions, build_reference_training_engine
    from verl.engines.reference.export import merge_reference_checkpoint
    from verl.plugins.specs import TrainingEngineSpec

    return [
        TrainingEngineSpec(
            name="reference",
            factory=build_reference_training_engine,
            options_cls=ReferenceEngineOptions,
            # Plain torch on the platform's device: npu too (torch-npu); never run on an Ascend yet, the
            # npu(reference-hf) nox session is the check.
            devices=("cpu", "cuda", "npu"),
            # Its module is a plain nn.Module a rollout engine can generate from (no second copy); it trains
            # peft LoRA adapters (model.lora_rank > 0, docs/lora.md).
            capabilities={"share_module", "lora"},
            merge_checkpoint=merge_reference_checkpoint,
        )
    ]


@hookimpl
def verl_rollout_engines() -> list:
    """``hf``: batched generation with HF ``transformers`` and a KV cache.

    Capabilities: ``share_module`` (it can generate from the actor's live module, no second copy),
    ``tensor_parallel`` (``rollout.tensor_model_parallel_size > 1`` splits it over DTensor TP groups) and
    ``async_server`` (``server()`` serves concurrent token-in/token-out requests for ``rollout.mode=async``).
    """
    from verl.engines.reference.builders import HFRolloutOptions, build_hf_rollout_engine
    from verl.engines.reference.rollout_options import check_hf_rollout_config
    from verl.plugins.specs import RolloutEngineSpec

    return [
        RolloutEngineSpec(
            name="hf",
            factory=build_hf_rollout_engine,
            options_cls=HFRolloutOptions,
            # Plain torch on the platform's device: npu too (torch-npu); never run on an Ascend yet, the
            # npu(reference-hf) nox session is the check.
            devices=("cpu", "cuda", "npu"),
            capabilities={"share_module", "tensor_parallel", "async_server"},
            check_config=check_hf_rollout_config,
        )
    ]


@hookimpl
def verl_checkpoint_engines() -> list:
    """``colocated``: trainer -> rollout weight hand-over inside one process (no disk, no copy when shared);
    ``broadcast``: bucketed torch.distributed broadcast to separate rollout processes (gloo/nccl/hccl)."""
    from verl.engines.weight_sync.broadcast import BroadcastOptions, build_broadcast_checkpoint_engine
    from verl.engines.weight_sync.colocated import ColocatedOptions, build_colocated_checkpoint_engine
    from verl.plugins.specs import CheckpointEngineSpec

    return [
        CheckpointEngineSpec(
            name="colocated",
            factory=build_colocated_checkpoint_engine,
            options_cls=ColocatedOptions,
            devices=("cpu", "cuda", "npu"),
        ),
        CheckpointEngineSpec(
            name="broadcast",
            factory=build_broadcast_checkpoint_engine,
            options_cls=BroadcastOptions,
            # The sync group is built by the platform (gloo/nccl in core, hccl by verl-npu).
            devices=("cpu", "cuda", "npu"),
        ),
    ]


@hookimpl
def verl_agent_loops() -> list[AgentLoopSpec]:
    """``single_turn_agent`` (also ``single_turn``): one model turn; ``tool_agent``: multi-turn tool use and
    interactions (:mod:`verl.agents`), verl's names."""
    from verl.agents.single_turn import SingleTurnAgentLoop
    from verl.agents.tool_agent import ToolAgentLoop

    return [
        AgentLoopSpec(name="single_turn_agent", factory=SingleTurnAgentLoop),
        AgentLoopSpec(name="single_turn", factory=SingleTurnAgentLoop),
        AgentLoopSpec(name="tool_agent", factory=ToolAgentLoop),
    ]
