"""The worker extension TensorRT-LLM mixes into its Ray GPU worker (``LLM(ray_worker_extension_cls=...)``).

TensorRT-LLM's ``RayWorkerWrapper._inject_worker_extension`` (``tensorrt_llm/executor/ray/gpu_worker.py``) builds
``type("RayGPUWorkerWith...", (RayGPUWorker, extension), {})`` after checking that no attribute of the extension
(but dunders) already exists on the worker; ``LLM._collective_rpc(name, args)`` then calls ``name`` on every
worker. This class runs **inside TensorRT-LLM's worker process**, never in the trainer's.

It extends TensorRT-LLM's own ``tensorrt_llm.llmapi.rlhf_utils.WorkerExtension`` (the one ``AsyncLLM`` installs by
default; its ``update_weights(ipc_handles)`` rebuilds CUDA IPC handles and reloads them with
``allow_partial_loading=True``, and ``update_weights(None)`` finalises, see :mod:`verl_trtllm.weights`) with the
one call the engine makes on its own: :meth:`VerlWorkerExtension.verl_reset_prefix_cache`, which drops every
reusable KV block after a weight update (as verl's extension does) so no prompt prefix computed with the old
weights is reused.

Where TensorRT-LLM is not installed (the trainer's CPU tests) the base is ``object``: the module imports, the
class has only its own method, and nothing here is reachable from a rollout.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("tensorrt_llm") is not None:  # inside TensorRT-LLM's worker: its real base class
    from tensorrt_llm.llmapi.rlhf_utils import WorkerExtension as _TRTLLMWorkerExtension
else:
    _TRTLLMWorkerExtension = object


class VerlWorkerExtension(_TRTLLMWorkerExtension):  # type: ignore[misc,valid-type]
    """TensorRT-LLM's RLHF worker extension plus a prefix-cache reset (methods run on each TensorRT-LLM worker).

    ``self.engine`` is the worker's ``PyExecutor`` (set by TensorRT-LLM's ``BaseWorker``).
    """

    def verl_reset_prefix_cache(self) -> None:
        """Invalidate every reusable KV-cache block (``PyExecutor.reset_prefix_cache``)."""
        self.engine.reset_prefix_cache()
