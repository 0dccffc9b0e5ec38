"""verl-megatron: the ``megatron`` training engine (Megatron-core: tensor, pipeline and data parallelism) for verl.

Select it with ``actor_rollout_ref.actor.strategy=megatron``; options live under
``actor_rollout_ref.actor.engine_kwargs.megatron`` (verl's ``actor_rollout_ref.actor.megatron.*`` keys land
there too), read by :class:`verl_megatron.options.MegatronEngineOptions`. Importing this package is cheap: torch
and megatron-core are imported by the submodules that need them.
"""

__all__ = ["MegatronEngineOptions", "MegatronTrainingEngine", "__version__"]

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep `import verl_megatron` free of torch and megatron
    if name == "MegatronTrainingEngine":
        from verl_megatron.engine import MegatronTrainingEngine

        return MegatronTrainingEngine
    if name == "MegatronEngineOptions":
        from verl_megatron.options import MegatronEngineOptions

        return MegatronEngineOptions
    raise AttributeError(name)
