"""Checks on a weight update before it reaches vLLM.

vLLM's in-place reload (``vllm.model_executor.model_loader.reload``) moves each layer to the meta device
while it loads, and only rebuilds the kernel tensors when the layer is complete: an unknown name, a wrong
shape or half of a fused projection mid-stream leaves the model unusable. So the whole update is checked
against the checkpoint's own names and shapes first, and nothing is loaded when a check fails.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

# HF projections vLLM fuses into one parameter (qkv_proj, gate_up_proj): they must be sent together.
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class UnknownWeightError(KeyError):
    """``update_weights`` received a parameter name the model's checkpoint does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """``{hf_name: shape}`` of every tensor in the model folder's ``*.safetensors`` (headers only, no data).

    With ``tie_word_embeddings`` in ``config.json`` and no ``lm_head.weight`` stored, ``lm_head.weight`` is
    added with the embedding's shape (trainers may send either tied name).

    Raises:
        FileNotFoundError: no ``*.safetensors`` file in the folder.
    """
    from safetensors import safe_open

    folder = Path(model_path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}: the vllm engine checks updates against them")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                shapes[name] = tuple(fh.get_slice(name).get_shape())
    config = folder / "config.json"
    tied = config.exists() and bool(json.loads(config.read_text()).get("tie_word_embeddings", False))
    if tied and "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes:
        shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    return shapes


def check_update(pairs: Iterable[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise before loading when an update could not be applied completely (see :func:`check_specs`)."""
    check_specs(((name, tuple(tensor.shape)) for name, tensor in pairs), shapes)


def check_specs(specs: Iterable[tuple[str, Sequence[int]]], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise when an update of these ``(name, shape)`` pairs could not be applied completely.

    Raises:
        UnknownWeightError (KeyError): a name not in the checkpoint (closest names suggested).
        ValueError: a shape mismatch (both shapes named), or a fused group sent in part (e.g. ``q_proj``
            without ``k_proj``/``v_proj`` of the same layer), naming the missing names.
    """
    names = set()
    for name, shape in specs:
        expected = shapes.get(name)
        if expected is None:
            close = difflib.get_close_matches(name, list(shapes), n=3)
            raise UnknownWeightError(
                f"update_weights: the model has no parameter {name!r}"
                + (f"; did you mean {close}?" if close else f" ({len(shapes)} known names)")
            )
        if tuple(shape) != tuple(expected):
            raise ValueError(f"update_weights: {name!r} has shape {tuple(shape)}, the rollout model expects {expected}")
        names.add(name)
    for group in FUSED_GROUPS:
        pattern = re.compile(r"^(.*\.)(" + "|".join(group) + r")(\.[a-z_]+)$")
        for name in sorted(names):
            match = pattern.match(name)
            if match is None:
                continue
            prefix, _, suffix = match.groups()
            missing = [f"{prefix}{part}{suffix}" for part in group if f"{prefix}{part}{suffix}" not in names]
            missing = [m for m in missing if m in shapes]
            if missing:
                raise ValueError(
                    f"update_weights: {name!r} was sent without {missing}; vLLM fuses {'/'.join(group)} into one "
                    "parameter, so send the whole group (a trainer's iter_weights sends every tensor)"
                )


def tied_embeddings(model_path: str | Path) -> bool:
    """Whether the checkpoint's ``config.json`` sets ``tie_word_embeddings``."""
    config = Path(model_path) / "config.json"
    return config.exists() and bool(json.loads(config.read_text()).get("tie_word_embeddings", False))


_FUSED_PATTERNS = [(re.compile(r"^(.*\.)(" + "|".join(g) + r")(\.[a-z_]+)$"), g) for g in FUSED_GROUPS]


def _group_of(name: str, shapes: Mapping[str, tuple[int, ...]]) -> frozenset[str] | None:
    """Every checkpoint name fused with ``name`` into one vLLM parameter (None when it is not fused)."""
    for pattern, group in _FUSED_PATTERNS:
        match = pattern.match(name)
        if match:
            prefix, _, suffix = match.groups()
            return frozenset(f"{prefix}{part}{suffix}" for part in group if f"{prefix}{part}{suffix}" in shapes)
    return None


def reload_batches(
    weights: Iterable[tuple[str, torch.Tensor]],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    bucket_bytes: int,
    tied: bool,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Cut an update stream into batches for vLLM's in-place reload, each a complete unit of layers.

    A batch closes once it holds ``bucket_bytes`` and no fused group (q/k/v, gate/up of one layer) is open,
    so every reload sees whole vLLM parameters and the receiver holds about one bucket of tensors at a time.
    Tensors are copied as they arrive (the sender may reuse its buffers once asked for the next one). With
    ``tied`` embeddings, ``lm_head.weight`` goes with ``model.embed_tokens.weight`` when the sender sends only
    the latter: vLLM's CPU LM head keeps its own packed copy, which a reload of the embedding alone leaves stale.

    Raises:
        UnknownWeightError, ValueError: as :func:`check_specs`, for the batch about to be loaded.
    """
    batch: list[tuple[str, torch.Tensor]] = []
    nbytes = 0
    open_groups: dict[frozenset[str], set[str]] = {}
    sent: set[str] = set()
    for name, tensor in weights:
        copy = tensor.detach().clone()
        batch.append((name, copy))
        sent.add(name)
        nbytes += copy.numel() * copy.element_size()
        if tied and name == "model.embed_tokens.weight" and "lm_head.weight" not in sent and "lm_head.weight" in shapes:
            batch.append(("lm_head.weight", copy))
        group = _group_of(name, shapes)
        if group is not None:
            seen = open_groups.setdefault(group, set())
            seen.add(name)
            if seen >= group:
                del open_groups[group]
        if nbytes >= bucket_bytes and not open_groups:
            check_update(batch, shapes)
            yield batch
            batch, nbytes = [], 0
    if batch:
        check_update(batch, shapes)
        yield batch
