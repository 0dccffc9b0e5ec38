"""The decode step's few-row linears as ``(W @ x^T)^T``: a faster product form for the hf engine on AVX2 CPUs."""

from __future__ import annotations

from typing import Any

import torch

SKINNY_ROWS = 64  # more rows than this (prefill, large batches) take the usual x @ W^T

# torch's CPU kernel level (torch.backends.cpu.get_cpu_capability()) on which the transposed form was measured
# faster. On an AVX-512 Xeon (2026-12-07) it is slower at every decode batch: SmolLM2 decode steps at batch
# 8 / 32 / 64 take 88 / 128 / 198 ms with it and 79 / 106 / 171 ms without (the LM head at 64 rows: 27.9 vs
# 15.3 ms), so only the measured AVX2 level uses it.
SKINNY_CAPABILITIES = frozenset({"AVX2"})


def skinny_form_helps(device: torch.device | str) -> bool:
    """Whether :class:`skinny_linears` changes anything for weights on ``device``: a CPU whose kernel level
    (``torch.backends.cpu.get_cpu_capability()``) is in :data:`SKINNY_CAPABILITIES`. GPUs: never."""
    return torch.device(device).type == "cpu" and torch.backends.cpu.get_cpu_capability() in SKINNY_CAPABILITIES


def _skinny_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] > SKINNY_ROWS:
        return torch.nn.functional.linear(x, module.weight, module.bias)
    out = torch.mm(module.weight, flat.t()).t()
    if module.bias is not None:
        out = out + module.bias
    return out.contiguous().reshape(*x.shape[:-1], module.weight.shape[0])


class skinny_linears:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Within the block, every plain ``nn.Linear`` of ``model`` computes ``(W @ x^T)^T`` for inputs of at
    most :data:`SKINNY_ROWS` rows (decode steps), the usual ``x @ W^T`` otherwise.

    Both are the same product; with a few rows and weights that are not in cache (a decode step reads each
    weight once), MKL's kernel for the transposed form is 1.3-2x faster on the AVX2 CPUs measured here
    (SmolLM2's 49k x 576 LM head at 32 rows: 52 -> 32 ms). Float summation order may differ in the last
    bits. The modules get their class's ``forward`` back on exit; quantised or sharded linears (weight not
    a plain tensor) are left alone, and so is every linear whose weights sit where the form does not help
    (:func:`skinny_form_helps`: AVX-512 CPUs, GPUs), so a run's results depend only on the machine type.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules = [
            m
            for m in model.modules()
            if type(m) is torch.nn.Linear
            and type(m.weight) in (torch.Tensor, torch.nn.Parameter)
            and skinny_form_helps(m.weight.device)
        ]

    def __enter__(self) -> skinny_linears:
        for m in self.modules:
            m.forward = _bind(m)
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in self.modules:
            m.__dict__.pop("forward", None)


def _bind(module: torch.nn.Linear) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return _skinny_linear(module, x)

    return forward
