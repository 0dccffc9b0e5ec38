"""Entry module of the verl-fsdp plugin (entry point ``fsdp`` in the group ``verl.plugins``).

Imports only verl and the standard library at module level; torch and the engine are imported
when the factory is called.
"""

from __future__ import annotations

from typing import Any

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import TrainingEngineSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION


def merge_checkpoint(actor_folder: Any, hf_source: Any, out_folder: Any) -> Any:
    """``verl export`` of a sharded DCP actor checkpoint (any world size) into a HF folder, in one process."""
    from verl_fsdp.checkpoint import merge_dcp_to_hf

    return merge_dcp_to_hf(actor_folder, hf_source, out_folder)


@hookimpl
def verl_training_engines() -> list[TrainingEngineSpec]:
    """``fsdp``: FSDP2-sharded training over the default process group (cpu/gloo, cuda/nccl, npu/hccl)."""
    from verl_fsdp.builder import build_fsdp_training_engine
    from verl_fsdp.options import FSDPEngineOptions

    return [
        TrainingEngineSpec(
            name="fsdp",
            factory=build_fsdp_training_engine,
            options_cls=FSDPEngineOptions,
            devices=("cpu", "cuda", "npu"),
            # Trains on any number of workers; its module is sharded, so a rollout engine cannot share it.
            capabilities={"data_parallel", "lora"},
            merge_checkpoint=merge_checkpoint,
        )
    ]
