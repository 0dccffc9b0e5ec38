"""Tensor parallelism for the ``hf`` rollout: a HF causal LM split over a TP group with torch DTensor.

:func:`parallelize_causal_lm` applies torch's ``parallelize_module`` (``ColwiseParallel`` /
``RowwiseParallel``) following a :class:`~verl.engines.weight_sync.layout.TensorParallelLayout`: q/k/v/gate/up
and the LM head column-parallel, o/down row-parallel, the embedding vocab-parallel, the rest replicated. The
parameters become DTensors on the group's 1-D mesh holding exactly the slice the layout names for this rank,
so the weight sync can hand each rank its slices (:mod:`verl.engines.weight_sync.reshard`) and
:func:`copy_into_parameter` writes them in place. Attention runs on the local heads (transformers reshapes with
``-1`` heads); the row-parallel outputs are all-reduced and the LM head's logits all-gathered, so every rank of
a group sees the same logits and samples the same tokens. Works with gloo on CPU and nccl on CUDA.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from verl.engines.weight_sync.layout import TensorParallelLayout, UnsupportedLayoutError


def tensor_parallel_mesh(layout: TensorParallelLayout, device_type: str) -> Any:
    """This rank's TP sub-mesh of a ``(dp, tp)`` mesh over the default group (collective: every rank calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (layout.dp_size, layout.tp_size), mesh_dim_names=("dp", "tp"))
    return mesh["tp"]


def _styles_for(model: torch.nn.Module, layout: TensorParallelLayout) -> dict[str, Any]:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    rules = [
        (re.compile("^" + re.escape(p).replace(r"\*", r"[^.]+") + "$"), s) for p, s in layout.module_styles.items()
    ]
    plan: dict[str, Any] = {}
    for path, module in model.named_modules():
        style = next((s for rule, s in rules if rule.match(path)), None)
        if style in (None, "replicate"):
            continue
        kind = "embedding" if isinstance(module, torch.nn.Embedding) else "linear"
        if not isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            raise UnsupportedLayoutError(
                f"tensor parallel: {path} ({type(module).__name__}) is planned {style!r} but only nn.Linear and "
                "nn.Embedding can be split; use tensor_model_parallel_size=1"
            )
        if style == "vocab" and kind == "embedding":
            plan[path] = RowwiseParallel(input_layouts=Replicate())
        elif style == "colwise" and kind == "linear":
            # The LM head gathers its vocabulary shards: every rank samples from the same full logits.
            plan[path] = ColwiseParallel(output_layouts=Replicate()) if path == "lm_head" else ColwiseParallel()
        elif style == "rowwise" and kind == "linear":
            plan[path] = RowwiseParallel()
        else:
            raise UnsupportedLayoutError(f"tensor parallel: style {style!r} does not fit {path} ({kind})")
    return plan


def parallelize_causal_lm(model: torch.nn.Module, layout: TensorParallelLayout, mesh: Any) -> torch.nn.Module:
    """Split ``model`` in place over ``mesh`` (this rank's TP group) as ``layout`` says; returns it.

    Tied input/output embeddings stay tied (both are vocab-split on dim 0, so one DTensor serves both).
    Each parameter's local shape is checked against the layout.

    Raises:
        UnsupportedLayoutError: a planned module is not an ``nn.Linear`` / ``nn.Embedding``.
        RuntimeError: a local shard does not have the layout's shape (the plan and the layout disagree).
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    tied = outputs is not None and outputs.weight is inputs.weight
    parallelize_module(model, mesh, _styles_for(model, layout))
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    rank = _global_rank()
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        want = layout.slice_for(name, tuple(param.shape), rank)
        got = tuple(param.to_local().shape)
        expected = tuple(param.shape) if want is None else want.shape_of(param.shape)
        if got != expected:
            raise RuntimeError(f"tensor parallel: {name} holds a {got} shard, the layout expects {expected}")
    return model


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def local_tensor(param: torch.Tensor) -> torch.Tensor:
    """The tensor holding this rank's data of ``param`` (its local shard for a DTensor)."""
    from torch.distributed.tensor import DTensor

    return param._local_tensor if isinstance(param, DTensor) else param.data


def copy_into_parameter(
    name: str, param: torch.Tensor, value: torch.Tensor, layout: TensorParallelLayout | None, rank: int
) -> None:
    """Write ``value`` into ``param``: either exactly this rank's shard, or the full tensor (sliced here).

    Raises:
        ValueError: ``value`` has neither the local nor the full shape (both named).
    """
    target = local_tensor(param)
    full = tuple(param.shape)
    if tuple(value.shape) == tuple(target.shape):
        target.copy_(value)
        return
    if tuple(value.shape) == full:
        piece = None if layout is None else layout.slice_for(name, full, rank)
        target.copy_(value if piece is None else value.narrow(piece.dim, piece.start, piece.length))
        return
    raise ValueError(
        f"update_weights: {name!r} has shape {tuple(value.shape)}; the rollout expects its shard "
        f"{tuple(target.shape)} or the full tensor {full}"
    )
