"""Factory of the ``sglang`` rollout engine spec: turns the run config into a :class:`SGLangRolloutEngine`."""

from __future__ import annotations

from typing import Any


def build_sglang_rollout_engine(
    config: Any, *, model: Any, options: Any, tokenizer: Any = None, device: Any = "cuda"
) -> Any:
    """Build the ``sglang`` engine for ``config.actor_rollout_ref.rollout``.

    Args:
        config: :class:`verl.config.RootConfig` (resolved: ``rollout.prompt_length``/``response_length`` set);
            ``actor_rollout_ref.model`` gives ``trust_remote_code`` and ``override_config``.
        model: resolved HF model folder (a live module is refused, see :class:`SGLangRolloutEngine`).
        options: the validated ``actor_rollout_ref.rollout.engine_kwargs.sglang``
            (:class:`~verl_sglang.options.SGLangRolloutOptions`, core's ``verl.config.role_options``); None = defaults.
        tokenizer: the worker's tokenizer.
        device: torch device of the worker (``cuda[:i]`` or ``npu[:i]``).

    Raises:
        SGLangNotInstalledError (ImportError): sglang cannot be imported, before the model is touched.
        whatever :class:`verl_sglang.engine.SGLangRolloutEngine` raises (device, context length, TP layout).
    """
    from verl_sglang.backend import device_type, import_sglang

    # Fail on the device and the install before touching the model.
    device_type(device)
    import_sglang()
    from verl_sglang.engine import SGLangRolloutEngine

    arr = config.actor_rollout_ref
    return SGLangRolloutEngine(
        model, tokenizer, arr.rollout, device=device, options=options, model_config=getattr(arr, "model", None)
    )
