"""Rollout placement checks (verl's ``RolloutMode``) and tensor-parallel size, run by ``validate_config``.

``rollout.mode`` and the agent sections are :mod:`verl.config.validate_agents`' checks.

* placement: ``hybrid`` needs ``rollout.nnodes = 0`` and the in-process ``colocated`` weight sync;
  ``colocated`` and ``standalone`` run the rollout as Ray actors (``trainer.controller=ray``) synced by
  ``broadcast``; ``standalone`` needs ``rollout.nnodes > 0``, ``colocated`` needs ``rollout.nnodes = 0`` (it
  uses the trainer's devices);
* ``rollout.tensor_model_parallel_size`` >= 1 and divides the rollout world size; the model-dependent
  checks (heads, key/value heads, vocabulary) run when the trainer loads the model config
  (:func:`verl.engines.weight_sync.layout.tensor_parallel_problems`);
* the engine keys every backend shares (:func:`check_engine_keys`): ranges, ``load_format=dummy`` refused,
  and verl's switches for features not built here refused at anything but verl's default. Whether a backend
  can honour a key is its own check (``RolloutEngineSpec.check_config``, run with the backend options).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.placement import rollout_placement, rollout_world_size
from verl.config.schema import RootConfig

ARR = "actor_rollout_ref"
TP_KEY = f"{ARR}.rollout.tensor_model_parallel_size"


# key -> (verl's default, the only value built here, why another value is refused)
NOT_BUILT: dict[str, tuple[object, str]] = {
    "data_parallel_size": (
        1,
        "data parallelism inside one rollout server is not built; replicas come from the trainer's world "
        "(trainer.nnodes x n_gpus_per_node / tensor_model_parallel_size)",
    ),
    "expert_parallel_size": (1, "expert-parallel MoE rollout is not built (Megatron / MoE support, issue #17)"),
    "pipeline_model_parallel_size": (1, "pipeline-parallel rollout is not built; use tensor_model_parallel_size"),
    "layered_summon": (
        False,
        "the LoRA sync always sends merged weights (W + (alpha/r) B @ A), each FSDP rank merging its own rows and "
        "the result going through the bucketed gather / resharding like any weight; verl's layer-by-layer FSDP "
        "summon is not a separate mode here (docs/lora.md)",
    ),
    "enable_rollout_routing_replay": (
        False,
        "MoE router replay (rollout routing recorded for the trainer) is not built (Megatron / MoE, issue #17)",
    ),
}


def check_engine_keys(cfg: RootConfig, report: IssueCollector) -> None:
    """Backend-independent checks of the rollout engine keys (``gpu_memory_utilization`` ... ``ignore_eos``)."""
    rollout = cfg.actor_rollout_ref.rollout
    key = f"{ARR}.rollout"
    if rollout.load_format == "dummy":
        report.error(
            f"{key}.load_format",
            "=dummy starts the rollout from random weights, which verl overwrites with a weight sync before the "
            "first generation; this trainer syncs after each update only, so step 1 would sample from random "
            "weights: use load_format=auto (or hf / safetensors)",
        )
    share = rollout.gpu_memory_utilization
    if share is not None and not 0.0 < share <= 1.0:
        report.error(f"{key}.gpu_memory_utilization", f"must be in (0, 1] (a share of device memory), got {share}")
    for name in ("max_num_batched_tokens", "max_model_len", "max_num_seqs"):
        value = getattr(rollout, name)
        if value is not None and value < 1:
            report.error(f"{key}.{name}", f"must be >= 1 or null (the backend's default), got {value}")
    needed = (rollout.prompt_length or 0) + (rollout.response_length or 0)
    if rollout.max_model_len is not None and 0 < rollout.max_model_len < needed:
        report.error(
            f"{key}.max_model_len",
            f"={rollout.max_model_len} is shorter than rollout.prompt_length + response_length = {needed}; "
            "raise it, or set it to null (= that sum)",
        )
    for name, (default, why) in NOT_BUILT.items():
        value = getattr(rollout, name)
        if value != default:
            report.error(f"{key}.{name}", f"={value}: {why}; only {default} is accepted")


def check_rollout(cfg: RootConfig, report: IssueCollector) -> None:
    """Add the rollout placement / mode / TP / engine-key errors of a resolved config to ``report``."""
    rollout = cfg.actor_rollout_ref.rollout
    check_engine_keys(cfg, report)
    if rollout.nnodes < 0 or rollout.n_gpus_per_node < 1:
        report.error(
            f"{ARR}.rollout.nnodes",
            f"({rollout.nnodes}) must be >= 0 and rollout.n_gpus_per_node ({rollout.n_gpus_per_node}) >= 1",
        )
        return
    placement = rollout_placement(cfg)
    backend_key = f"{ARR}.rollout.checkpoint_engine.backend"
    backend = rollout.checkpoint_engine.backend
    key = f"{ARR}.rollout.placement"
    if placement == "hybrid":
        if rollout.nnodes > 0:
            report.error(
                key,
                f"=hybrid runs the rollout on the trainer's workers, but rollout.nnodes={rollout.nnodes} asks for a "
                "pool of its own; set placement=standalone (or rollout.nnodes=0)",
            )
        if backend == "broadcast":
            report.error(
                backend_key,
                "=broadcast sends weights to rollout processes of their own; with placement=hybrid the rollout "
                f"lives in the trainer's processes: set {backend_key}=colocated",
            )
    else:
        if cfg.trainer.controller != "ray":
            report.error(
                key if rollout.nnodes == 0 else f"{ARR}.rollout.nnodes",
                f"placement={placement} runs the rollout in processes of its own, as Ray actors; set "
                "trainer.controller=ray (or placement=hybrid)",
            )
        if backend == "colocated":
            report.error(
                backend_key,
                "colocated hands weights over inside one process, but the rollout "
                f"(placement={placement}) lives in other processes; set {backend_key}=broadcast",
            )
        if placement == "standalone" and rollout.nnodes == 0:
            report.error(key, "=standalone needs devices of its own: set rollout.nnodes and rollout.n_gpus_per_node")
        if placement == "colocated" and rollout.nnodes > 0:
            report.error(
                key,
                f"=colocated shares the trainer's devices, but rollout.nnodes={rollout.nnodes} asks for others; "
                "set rollout.nnodes=0 (or placement=standalone)",
            )
    tp = rollout.tensor_model_parallel_size
    world = rollout_world_size(cfg)
    if tp < 1:
        report.error(TP_KEY, f"must be >= 1, got {tp}")
    elif world % tp:
        valid = [d for d in range(1, world + 1) if world % d == 0]
        report.error(
            TP_KEY,
            f"={tp} must divide the rollout world size {world} ({placement}: replicas x tensor-parallel size); "
            f"valid: {valid}",
        )
    else:
        per_node = rollout.n_gpus_per_node if placement == "standalone" else cfg.trainer.n_gpus_per_node
        if per_node % tp:
            report.warn(
                TP_KEY,
                f"={tp} does not divide the {per_node} workers per node: some tensor-parallel groups span machines, "
                "and every layer's all-reduce then crosses the network",
            )
