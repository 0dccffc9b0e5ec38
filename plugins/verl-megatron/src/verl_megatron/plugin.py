"""Entry module of the verl-megatron plugin (entry point ``megatron`` in the group ``verl.plugins``).

Imports only verl and the standard library at module level; torch, megatron-core and the engine are imported
when the factory is called, so ``verl plugins`` lists this plugin (saying what is missing) even where
megatron-core is not installed.
"""

from __future__ import annotations

from typing import Any

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import TrainingEngineSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION

MISSING = "megatron-core missing: pip install './plugins/verl-megatron[cpu]' (or [cuda])"


def megatron_available() -> bool | str:
    """``True`` when ``megatron.core`` can be imported, else :data:`MISSING` (how to install it).

    Found without importing it (``importlib.util.find_spec``; ``megatron`` is a namespace package, so looking
    up ``megatron.core`` imports nothing of megatron-core).
    """
    import importlib.util

    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no `megatron` package at all: find_spec of a submodule raises
        found = False
    return True if found else MISSING


def merge_checkpoint(actor_folder: Any, hf_source: Any, out_folder: Any) -> Any:
    """``verl export``: a Megatron ``dist_checkpointing`` actor checkpoint (any parallel layout) -> a HF folder,
    in one process (:func:`verl_megatron.checkpoint.merge_to_hf`); ``hf_source`` holds the config and tokenizer."""
    from verl_megatron.checkpoint import merge_to_hf

    return merge_to_hf(actor_folder, hf_source, out_folder)


@hookimpl
def verl_training_engines() -> list[TrainingEngineSpec]:
    """``megatron``: Megatron-core tensor/pipeline/data-parallel training (cpu/gloo with the local layer spec,
    cuda/nccl with Transformer Engine or the local spec)."""
    from verl_megatron.builder import build_megatron_training_engine
    from verl_megatron.options import MegatronEngineOptions

    return [
        TrainingEngineSpec(
            name="megatron",
            factory=build_megatron_training_engine,
            options_cls=MegatronEngineOptions,
            devices=("cpu", "cuda"),
            # Trains on any number of workers; its module is split over TP/PP ranks, so a rollout engine cannot
            # share it (no share_module): weights reach the rollout through iter_weights().
            capabilities={"data_parallel"},
            merge_checkpoint=merge_checkpoint,
            available=megatron_available,
        )
    ]
