"""The critic's value head on Megatron's GPTModel: ``output_layer`` replaced by a ``Linear(hidden, 1)``.

As verl's Megatron critic (``verl/models/mcore``: ``value=True`` swaps the vocabulary head for a one-output linear
layer, ``LinearForLastLayer``), and numerically the reference critic's head: HF's
``AutoModelForTokenClassification(num_labels=1)`` ``score`` layer (weight and bias). The head is replicated on
every tensor-parallel rank (its input is the full hidden state); its gradient is the same on each of them, and
Megatron's grad norm counts a parameter without ``tensor_model_parallel`` once.

Weights: a value-model checkpoint (saved from ``*ForTokenClassification``) holds ``score.weight`` /
``score.bias`` and they are loaded; a causal-LM checkpoint has none and the head starts as HF initialises it
(normal(0, ``initializer_range``) weight, zero bias), drawn from a generator seeded with the engine's ``seed``
(the same on every rank; not HF's random stream, so not the reference critic's draw).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

HF_NAMES = ("score.weight", "score.bias")


class ValueHead(torch.nn.Linear):
    """``Linear(hidden, 1)`` called the way GPTModel calls its output layer: returns ``(values, None)``."""

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None) -> Any:  # noqa: ARG002
        return super().forward(hidden), None


def attach(model: Any, hidden_size: int, dtype: torch.dtype, device: Any) -> ValueHead:
    """Replace ``model.output_layer`` (last pipeline stage) by a :class:`ValueHead`; returns it."""
    head = ValueHead(hidden_size, 1, bias=True, dtype=dtype, device=device)
    model.output_layer = head
    return head


def load(head: ValueHead, folder: Any, *, seed: int, initializer_range: float) -> bool:
    """Fill ``head`` from ``folder``'s ``score.*`` tensors; HF's initialisation when it has none.

    Returns:
        True when the head was loaded from the checkpoint.

    Raises:
        ValueError: a ``score.weight`` whose shape is not ``(1, hidden)`` (a classifier with more labels).
    """
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in HF_NAMES:
                if name in handle.keys():
                    found[name] = handle.get_tensor(name)
    with torch.no_grad():
        if "score.weight" in found:
            weight = found["score.weight"]
            if tuple(weight.shape) != tuple(head.weight.shape):
                raise ValueError(
                    f"critic.model.path={folder}: score.weight has shape {tuple(weight.shape)}, the value head needs "
                    f"{tuple(head.weight.shape)} (num_labels=1)"
                )
            head.weight.copy_(weight)
            head.bias.copy_(found.get("score.bias", torch.zeros(1)))
            return True
        gen = torch.Generator().manual_seed(int(seed))
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * float(initializer_range))
        head.bias.zero_()
    return False
