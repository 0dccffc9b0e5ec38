"""Checks on a weight update before it reaches vLLM: core's shared checks, named for vLLM.

vLLM's in-place reload (``vllm.model_executor.model_loader.reload``) moves each layer to the meta device
while it loads, and only rebuilds the kernel tensors when the layer is complete: an unknown name, a wrong
shape or half of a fused projection mid-stream leaves the model unusable. So the whole update is checked
against the checkpoint's own names and shapes first (:mod:`verl.engines.weight_sync.names`, shared with the
other rollout plugins), and nothing is loaded when a check fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch

from verl.engines.weight_sync.names import UnknownWeightError, checkpoint_shapes, tied_embeddings, update_buckets
from verl.engines.weight_sync.names import check_specs as _check_specs

__all__ = ["UnknownWeightError", "check_specs", "checkpoint_shapes", "reload_batches", "tied_embeddings"]


def check_specs(specs: Iterable[tuple[str, Sequence[int]]], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """:func:`verl.engines.weight_sync.names.check_specs` with vLLM named in the messages."""
    _check_specs(specs, shapes, engine="vllm")


def reload_batches(
    weights: Iterable[tuple[str, torch.Tensor]],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    bucket_bytes: int,
    tied: bool,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Batches for vLLM's in-place reload, each a complete unit of layers (tensors copied as they arrive).

    With ``tied`` embeddings ``lm_head.weight`` goes with ``model.embed_tokens.weight``: vLLM's CPU LM head
    keeps its own packed copy, which a reload of the embedding alone leaves stale. See
    :func:`verl.engines.weight_sync.names.update_buckets`.

    Raises:
        UnknownWeightError, ValueError: as :func:`check_specs`, for the batch about to be loaded.
    """
    return update_buckets(weights, shapes, bucket_bytes=bucket_bytes, tied=tied, engine="vllm")
