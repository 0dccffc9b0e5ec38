"""Prompt data: GSM8K preparation, the RLHF prompt dataset, and the resumable sampler/loader.

Names resolve lazily (PEP 562) so ``verl data gsm8k`` and ``import verl.data.gsm8k`` need
neither torch nor transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# name -> module; resolved on first access.
_LAZY = {
    "prepare_gsm8k": "verl.data.gsm8k",
    "default_source_dir": "verl.data.gsm8k",
    "GSM8KFormatError": "verl.data.gsm8k",
    "RLHFDataset": "verl.data.dataset",
    "collate_fn": "verl.data.dataset",
    "compute_position_ids": "verl.data.dataset",
    "ChatTemplateError": "verl.data.dataset",
    "PromptFormatError": "verl.data.dataset",
    "PromptTooLongError": "verl.data.dataset",
    "RewardColumns": "verl.data.rows",
    "StatefulSampler": "verl.data.sampler",
    "PromptDataLoader": "verl.data.sampler",
    "create_dataloader": "verl.data.sampler",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from verl.data.dataset import (  # noqa: F401
        ChatTemplateError,
        PromptFormatError,
        PromptTooLongError,
        RLHFDataset,
        collate_fn,
        compute_position_ids,
    )
    from verl.data.gsm8k import GSM8KFormatError, default_source_dir, prepare_gsm8k  # noqa: F401
    from verl.data.rows import RewardColumns  # noqa: F401
    from verl.data.sampler import PromptDataLoader, StatefulSampler, create_dataloader  # noqa: F401


def __getattr__(name: str) -> Any:
    try:
        module_name = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'verl.data' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
