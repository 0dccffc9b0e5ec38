"""Factory of the ``trtllm`` rollout engine spec: turns the run config into a :class:`TRTLLMRolloutEngine`."""

from __future__ import annotations

from typing import Any


def placement_problem(config: Any) -> str | None:
    """Why this run's placement is not one the engine is built for, or None.

    The engine runs TensorRT-LLM's Ray orchestrator inside the trainer's process; with ``trainer.controller=ray``
    (or a world of several workers, which needs it) the trainer's workers are Ray actors holding their GPUs, and
    TensorRT-LLM's worker would wait for a GPU of its own that never frees (verl shares it with fractional GPU
    placement groups, which is not built here).
    """
    trainer = getattr(config, "trainer", None)
    controller = getattr(trainer, "controller", None)
    world = int(getattr(trainer, "nnodes", 1) or 1) * int(getattr(trainer, "n_gpus_per_node", 1) or 1)
    if controller == "ray" or world > 1:
        return (
            f"rollout engine 'trtllm' runs in hybrid mode with one in-process trainer worker (trainer.controller=local, "
            f"trainer.nnodes x n_gpus_per_node = 1); this run has controller={controller!r} and {world} workers: "
            "TensorRT-LLM's own Ray worker cannot share a GPU a Ray trainer worker holds (not built); use "
            "trainer.controller=local with one GPU, or actor_rollout_ref.rollout.name=vllm"
        )
    return None


def build_trtllm_rollout_engine(
    config: Any, *, model: Any, options: Any, tokenizer: Any = None, device: Any = "cuda"
) -> Any:
    """Build the ``trtllm`` engine for ``config.actor_rollout_ref.rollout``.

    Args:
        config: :class:`verl.config.RootConfig` (resolved: ``rollout.prompt_length``/``response_length`` set);
            ``actor_rollout_ref.model`` gives ``trust_remote_code`` and ``override_config``.
        model: resolved HF model folder (a live module is refused).
        options: the validated ``actor_rollout_ref.rollout.engine_kwargs.trtllm``
            (:class:`~verl_trtllm.options.TRTLLMRolloutOptions`); None = defaults.
        tokenizer: the worker's tokenizer.
        device: torch device of the worker (``cuda``).

    Raises:
        ValueError: a placement the engine is not built for (:func:`placement_problem`), a non-cuda device.
        TRTLLMNotInstalledError (ImportError): TensorRT-LLM missing, with the install command.
        whatever :class:`verl_trtllm.engine.TRTLLMRolloutEngine` raises.
    """
    from verl_trtllm.backend import device_type, import_tensorrt_llm

    # Fail on the placement, the device and the install before touching the model.
    problem = placement_problem(config)
    if problem is not None:
        raise ValueError(problem)
    device_type(device)
    import_tensorrt_llm()
    from verl_trtllm.engine import TRTLLMRolloutEngine

    arr = config.actor_rollout_ref
    return TRTLLMRolloutEngine(
        model, tokenizer, arr.rollout, device=device, options=options, model_config=getattr(arr, "model", None)
    )
