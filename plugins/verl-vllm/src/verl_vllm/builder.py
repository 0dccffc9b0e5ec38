"""Factory of the ``vllm`` rollout engine spec: turns the run config into a :class:`VLLMRolloutEngine`."""

from __future__ import annotations

from typing import Any


def build_vllm_rollout_engine(
    config: Any, *, model: Any, options: Any, tokenizer: Any = None, device: Any = "cpu"
) -> Any:
    """Build the ``vllm`` engine for ``config.actor_rollout_ref.rollout``.

    Args:
        config: :class:`verl.config.RootConfig` (resolved: ``rollout.prompt_length``/``response_length`` set);
            ``actor_rollout_ref.model`` gives ``trust_remote_code`` and ``override_config``.
        model: resolved HF model folder (a live module is refused, see :class:`VLLMRolloutEngine`).
        options: the validated ``actor_rollout_ref.rollout.engine_kwargs.vllm``
            (:class:`~verl_vllm.options.VLLMRolloutOptions`, core's ``verl.config.role_options``); None = defaults.
        tokenizer: the worker's tokenizer.
        device: torch device of the worker (``cpu`` or ``cuda``).

    Raises:
        whatever :class:`verl_vllm.engine.VLLMRolloutEngine` raises (vLLM missing, device, context length).
    """
    from verl_vllm.backend import device_type, import_vllm

    # Fail on the device and the install before touching the model.
    import_vllm(device_type(device))
    from verl.config import serves_lora_adapters
    from verl_vllm.engine import VLLMRolloutEngine
    from verl_vllm.plugin import CAPABILITIES

    arr = config.actor_rollout_ref
    model_config = getattr(arr, "model", None)
    # LoRA: served as an adapter unless model.lora.merge=true (or unset on a CPU) or the placement is not hybrid.
    lora_rank = int(model_config.lora_rank) if serves_lora_adapters(config, CAPABILITIES, device) else 0
    return VLLMRolloutEngine(
        model, tokenizer, arr.rollout, device=device, options=options, model_config=model_config, lora_rank=lora_rank
    )
