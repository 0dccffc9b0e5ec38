"""verl-sglang: the ``sglang`` rollout engine for verl (an in-process ``sglang.Engine`` beside the trainer).

Select it with ``actor_rollout_ref.rollout.name=sglang``; options live under
``actor_rollout_ref.rollout.engine_kwargs.sglang`` (:class:`verl_sglang.options.SGLangRolloutOptions`: the plugin's
own options plus every ``ServerArgs`` field of the installed sglang). Install the backend from the verl checkout
with ``pip install './plugins/verl-sglang[cuda]'`` on a machine with an NVIDIA GPU.
Importing this package is cheap: SGLang and torch are imported when an engine is built.
"""

__all__ = ["SGLangNotInstalledError", "SGLangRolloutEngine", "SGLangRolloutOptions", "__version__"]

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep `import verl_sglang` free of torch and sglang
    if name == "SGLangRolloutEngine":
        from verl_sglang.engine import SGLangRolloutEngine

        return SGLangRolloutEngine
    if name == "SGLangRolloutOptions":
        from verl_sglang.options import SGLangRolloutOptions

        return SGLangRolloutOptions
    if name == "SGLangNotInstalledError":
        from verl_sglang.backend import SGLangNotInstalledError

        return SGLangNotInstalledError
    raise AttributeError(name)
