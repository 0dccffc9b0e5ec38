"""verl-fsdp: the ``fsdp`` training engine (FSDP2, ``torch.distributed.fsdp.fully_shard``) for verl.

Select it with ``actor_rollout_ref.actor.strategy=fsdp``; options live under
``actor_rollout_ref.actor.engine_kwargs.fsdp`` (:class:`verl_fsdp.options.FSDPEngineOptions`).
Importing this package is cheap: torch is imported by the submodules that need it.
"""

__all__ = ["FSDPEngineOptions", "FSDPTrainingEngine", "__version__", "merge_dcp_to_hf"]

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: keep `import verl_fsdp` free of torch
    if name == "FSDPTrainingEngine":
        from verl_fsdp.engine import FSDPTrainingEngine

        return FSDPTrainingEngine
    if name == "merge_dcp_to_hf":
        from verl_fsdp.checkpoint import merge_dcp_to_hf

        return merge_dcp_to_hf
    if name == "FSDPEngineOptions":
        from verl_fsdp.options import FSDPEngineOptions

        return FSDPEngineOptions
    raise AttributeError(name)
