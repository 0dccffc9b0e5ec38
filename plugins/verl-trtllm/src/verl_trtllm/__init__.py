"""verl-trtllm: the ``trtllm`` rollout engine for verl (a ``tensorrt_llm.LLM`` beside the trainer, NVIDIA GPUs).

Select it with ``actor_rollout_ref.rollout.name=trtllm``; options live under
``actor_rollout_ref.rollout.engine_kwargs.trtllm`` (:class:`verl_trtllm.options.TRTLLMRolloutOptions`).
Install TensorRT-LLM from NVIDIA's index, from the verl checkout:
``pip install --extra-index-url https://pypi.nvidia.com './plugins/verl-trtllm[cuda]'``.
Importing this package is cheap: TensorRT-LLM and torch are imported when an engine is built.
"""

__all__ = ["TRTLLMNotInstalledError", "TRTLLMRolloutEngine", "TRTLLMRolloutOptions", "__version__"]

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep `import verl_trtllm` free of torch and tensorrt_llm
    if name == "TRTLLMRolloutEngine":
        from verl_trtllm.engine import TRTLLMRolloutEngine

        return TRTLLMRolloutEngine
    if name == "TRTLLMRolloutOptions":
        from verl_trtllm.options import TRTLLMRolloutOptions

        return TRTLLMRolloutOptions
    if name == "TRTLLMNotInstalledError":
        from verl_trtllm.backend import TRTLLMNotInstalledError

        return TRTLLMNotInstalledError
    raise AttributeError(name)
