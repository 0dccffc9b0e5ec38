"""Importing TensorRT-LLM, and the few objects of it the engine uses, behind one small binding.

TensorRT-LLM runs on NVIDIA GPUs only and installs from NVIDIA's index; it is imported lazily, when an engine
is built. The engine talks to it through :class:`TRTLLMBinding` (the ``LLM`` class, ``SamplingParams``, the
memory tags of ``ExecutorMemoryType``, the device UUID function, CUDA IPC handles), so its control flow can be
exercised against a recording stand-in where TensorRT-LLM cannot be installed (``tests/``): such a stand-in
shows our call order, never that TensorRT-LLM works.

Sources read (``NVIDIA/TensorRT-LLM``): ``tensorrt_llm/llmapi/llm.py`` (``LLM``), ``tensorrt_llm/llmapi/llm_args.py``
(``ExecutorMemoryType``, ``SleepConfig``), ``tensorrt_llm/_torch/utils.py`` (``get_device_uuid``), and
``tensorrt_llm/llmapi/rlhf_utils.py`` (the IPC payload its ``WorkerExtension.update_weights`` decodes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

SUPPORTED_DEVICES = ("cuda",)
INSTALL_COMMAND = "pip install --extra-index-url https://pypi.nvidia.com './plugins/verl-trtllm[cuda]'"


class TRTLLMNotInstalledError(ImportError):
    """TensorRT-LLM cannot be imported; the message gives the install command (NVIDIA's index)."""


class UnsupportedDeviceError(ValueError):
    """The ``trtllm`` rollout engine was asked to run on a device other than an NVIDIA GPU."""


def device_type(device: Any) -> str:
    """``"cuda"`` for a torch device / device string of an NVIDIA GPU (``"cuda:0"`` -> ``"cuda"``).

    Raises:
        UnsupportedDeviceError: any other device type (``cpu``, ``npu``, ...), naming the alternatives.
    """
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if kind not in SUPPORTED_DEVICES:
        raise UnsupportedDeviceError(
            f"rollout engine 'trtllm' runs on NVIDIA GPUs only (device {str(device)!r}); set trainer.device=cuda, "
            "or use actor_rollout_ref.rollout.name=hf (any device) or vllm (cpu, cuda)"
        )
    return kind


def import_tensorrt_llm() -> Any:
    """Import and return the ``tensorrt_llm`` module.

    Raises:
        TRTLLMNotInstalledError: TensorRT-LLM is missing or fails to import (the original error is kept and
            quoted: a broken CUDA install fails here too).
    """
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise TRTLLMNotInstalledError(
            f"rollout engine 'trtllm' needs TensorRT-LLM, which cannot be imported ({exc}); install it on an "
            f"NVIDIA GPU machine, from the verl checkout: {INSTALL_COMMAND}; or use actor_rollout_ref.rollout.name=hf"
        ) from exc
    return tensorrt_llm


@attrs.frozen(kw_only=True)
class TRTLLMBinding:
    """What the engine needs from TensorRT-LLM, in one place.

    Attributes:
        LLM: ``tensorrt_llm.LLM`` (called with the keyword arguments of :func:`verl_trtllm.translate.llm_kwargs`).
        SamplingParams: ``tensorrt_llm.SamplingParams`` (called with :func:`verl_trtllm.translate.sampling_kwargs`).
        memory_tags: every ``ExecutorMemoryType`` value of the installed version (``"kv_cache"``, ``"model"``,
            ...), from which :func:`verl_trtllm.translate.release_tags` picks what ``weights`` means.
        device_uuid: ``f(device_index) -> str``, TensorRT-LLM's ``get_device_uuid`` (the key its worker looks
            its IPC handles up by).
        reduce_tensor: ``torch.multiprocessing.reductions.reduce_tensor`` (a CUDA tensor -> ``(rebuild_fn,
            args)``, the IPC handle TensorRT-LLM's worker rebuilds).
        staging_device: ``f() -> torch.device`` where update tensors are staged for IPC (this process's GPU).
        llm_fields: the installed ``TorchLlmArgs`` field names (None: unknown), so an argument a release
            removed (``sampler_type``) is not passed (:func:`verl_trtllm.engine_args.resolve_sampler`).
    """

    LLM: Any
    SamplingParams: Any
    memory_tags: tuple[str, ...]
    device_uuid: Callable[[int], str]
    reduce_tensor: Callable[[Any], Any]
    staging_device: Callable[[], Any]
    llm_fields: frozenset[str] | None = None


def load_binding() -> TRTLLMBinding:
    """The :class:`TRTLLMBinding` of the installed TensorRT-LLM.

    Raises:
        TRTLLMNotInstalledError: TensorRT-LLM cannot be imported.
        ImportError: it imports but lacks ``ExecutorMemoryType`` (a release before the sleep/wake-up API of the
            1.3 line this plugin is built for), naming the installed version.
    """
    trtllm = import_tensorrt_llm()
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    try:
        from tensorrt_llm.llmapi.llm_args import ExecutorMemoryType
    except ImportError as exc:
        version = getattr(trtllm, "__version__", "?")
        raise ImportError(
            f"rollout engine 'trtllm' needs TensorRT-LLM >= 1.3.0rc15 (ExecutorMemoryType, SleepConfig); "
            f"tensorrt_llm {version} is installed: {INSTALL_COMMAND}"
        ) from exc
    from tensorrt_llm._torch.utils import get_device_uuid

    try:
        from tensorrt_llm.llmapi.llm_args import TorchLlmArgs

        llm_fields: frozenset[str] | None = frozenset(getattr(TorchLlmArgs, "model_fields", None) or ()) or None
    except ImportError:
        llm_fields = None
    return TRTLLMBinding(
        LLM=trtllm.LLM,
        SamplingParams=trtllm.SamplingParams,
        memory_tags=memory_tag_values(ExecutorMemoryType),
        device_uuid=get_device_uuid,
        reduce_tensor=reduce_tensor,
        staging_device=lambda: torch.device("cuda", torch.cuda.current_device()),
        llm_fields=llm_fields,
    )


def memory_tag_values(enum_cls: Sequence[Any]) -> tuple[str, ...]:
    """The string values of an ``ExecutorMemoryType``-like enum, in declaration order."""
    return tuple(str(getattr(member, "value", member)) for member in enum_cls)
