"""Checks on a weight update bound for a rollout engine that loads its own copy of the checkpoint.

vLLM, SGLang and TensorRT-LLM build their model from the HF folder and fuse some projections into one
parameter (``q_proj``/``k_proj``/``v_proj`` -> ``qkv_proj``, ``gate_proj``/``up_proj`` -> ``gate_up_proj``).
A weight sync streams HF-named tensors into that model. When a name is unknown, a shape is wrong, or half of
a fused group arrives in one load, the engine either raises halfway (leaving the model partly updated) or
loads garbage silently. So the whole update is checked against the checkpoint's own names and shapes before
anything is sent, and the stream is cut into buckets that never split a fused group.

Shared by the rollout plugins (``verl-vllm``, ``verl-sglang``, ``verl-trtllm``); plugin API 2.3.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

# HF projections the serving engines fuse into one parameter: they must be loaded together.
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))

_FUSED_PATTERNS = [(re.compile(r"^(.*\.)(" + "|".join(g) + r")(\.[a-z_]+)$"), g) for g in FUSED_GROUPS]
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


class UnknownWeightError(KeyError):
    """A weight update named a parameter the rollout model's checkpoint does not have."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def tied_embeddings(model_path: str | Path) -> bool:
    """Whether the checkpoint's ``config.json`` sets ``tie_word_embeddings`` (False without a config)."""
    config = Path(model_path) / "config.json"
    return config.exists() and bool(json.loads(config.read_text()).get("tie_word_embeddings", False))


def checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """``{hf_name: shape}`` of every tensor in the folder's ``*.safetensors`` (headers only, no data read).

    With ``tie_word_embeddings`` and no ``lm_head.weight`` stored, ``lm_head.weight`` is added with the
    embedding's shape (a trainer may send either tied name).

    Raises:
        FileNotFoundError: no ``*.safetensors`` file in the folder (a ``.bin``-only checkpoint: convert it with
            ``save_pretrained(safe_serialization=True)``).
    """
    from safetensors import safe_open

    folder = Path(model_path)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors weights in {folder}: the rollout engine checks weight updates against them "
            "(re-save the model with save_pretrained(..., safe_serialization=True))"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                shapes[name] = tuple(fh.get_slice(name).get_shape())
    if tied_embeddings(folder) and LM_HEAD not in shapes and EMBEDDING in shapes:
        shapes[LM_HEAD] = shapes[EMBEDDING]
    return shapes


def fused_group(name: str, shapes: Mapping[str, tuple[int, ...]]) -> frozenset[str] | None:
    """Every checkpoint name loaded together with ``name`` into one fused parameter (None: not fused)."""
    for pattern, group in _FUSED_PATTERNS:
        match = pattern.match(name)
        if match:
            prefix, _, suffix = match.groups()
            return frozenset(f"{prefix}{part}{suffix}" for part in group if f"{prefix}{part}{suffix}" in shapes)
    return None


def check_specs(
    specs: Iterable[tuple[str, Sequence[int]]], shapes: Mapping[str, tuple[int, ...]], *, engine: str = "rollout"
) -> None:
    """Raise when an update of these ``(name, shape)`` pairs could not be applied completely.

    Args:
        specs: ``(hf_name, shape)`` of every tensor of the update (or of one load).
        shapes: the checkpoint's ``{hf_name: shape}`` (:func:`checkpoint_shapes`).
        engine: the engine's name for the messages (``"vllm"``, ``"sglang"``).

    Raises:
        UnknownWeightError (KeyError): a name not in the checkpoint (the closest names suggested).
        ValueError: a shape mismatch (both shapes named), or a fused group sent in part (e.g. ``q_proj``
            without ``k_proj``/``v_proj`` of the same layer), naming the missing names.
    """
    names = set()
    for name, shape in specs:
        expected = shapes.get(name)
        if expected is None:
            close = difflib.get_close_matches(name, list(shapes), n=3)
            raise UnknownWeightError(
                f"update_weights ({engine}): the model has no parameter {name!r}"
                + (f"; did you mean {close}?" if close else f" ({len(shapes)} known names)")
            )
        if tuple(shape) != tuple(expected):
            raise ValueError(
                f"update_weights ({engine}): {name!r} has shape {tuple(shape)}, the rollout model expects {expected}"
            )
        names.add(name)
    for name in sorted(names):
        group = fused_group(name, shapes)
        missing = sorted(group - names) if group else []
        if missing:
            parts = "/".join(n.rsplit(".", 2)[-2] for n in sorted(group))
            raise ValueError(
                f"update_weights ({engine}): {name!r} was sent without {missing}; {engine} fuses {parts} into one "
                "parameter, so send the whole group in one load (a trainer's iter_weights sends every tensor)"
            )


def check_update(
    pairs: Iterable[tuple[str, torch.Tensor]], shapes: Mapping[str, tuple[int, ...]], *, engine: str = "rollout"
) -> None:
    """:func:`check_specs` on ``(name, tensor)`` pairs (their shapes)."""
    check_specs(((name, tuple(tensor.shape)) for name, tensor in pairs), shapes, engine=engine)


def update_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    bucket_bytes: int,
    tied: bool,
    engine: str = "rollout",
    copy: bool = True,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Cut an update stream into buckets for an engine's load call, each a complete unit of parameters.

    A bucket closes once it holds at least ``bucket_bytes`` and no fused group (q/k/v, gate/up of one layer)
    is open, so every load sees whole fused parameters and the receiver holds about one bucket at a time.
    With ``copy`` each tensor is copied as it arrives (the sender may reuse its buffers once asked for the
    next one). With ``tied`` embeddings, ``lm_head.weight`` goes with ``model.embed_tokens.weight`` when the
    sender sends only the latter: an engine that keeps its own copy of the head would otherwise keep the old
    one. Each bucket is checked (:func:`check_update`) before it is yielded.

    Args:
        weights: ``(hf_name, tensor)`` pairs, full tensors.
        shapes: the checkpoint's ``{hf_name: shape}``.
        bucket_bytes: the bucket size in bytes (> 0); a single tensor larger than it is a bucket of its own.
        tied: the checkpoint ties the embedding and the LM head.

    Raises:
        UnknownWeightError, ValueError: as :func:`check_specs`, for the bucket about to be yielded.
        ValueError: ``bucket_bytes`` < 1.
    """
    if bucket_bytes < 1:
        raise ValueError(f"update_buckets: bucket_bytes must be >= 1, got {bucket_bytes}")
    batch: list[tuple[str, torch.Tensor]] = []
    nbytes = 0
    open_groups: dict[frozenset[str], set[str]] = {}
    sent: set[str] = set()
    for name, tensor in weights:
        item = tensor.detach().clone() if copy else tensor.detach()
        batch.append((name, item))
        sent.add(name)
        nbytes += item.numel() * item.element_size()
        if tied and name == EMBEDDING and LM_HEAD not in sent and LM_HEAD in shapes:
            batch.append((LM_HEAD, item))
            sent.add(LM_HEAD)
        group = fused_group(name, shapes)
        if group is not None:
            seen = open_groups.setdefault(group, set())
            seen.add(name)
            if seen >= group:
                del open_groups[group]
        if nbytes >= bucket_bytes and not open_groups:
            check_update(batch, shapes, engine=engine)
            yield batch
            batch, nbytes = [], 0
    if batch:
        check_update(batch, shapes, engine=engine)
        yield batch


__all__ = [
    "FUSED_GROUPS",
    "UnknownWeightError",
    "check_specs",
    "check_update",
    "checkpoint_shapes",
    "fused_group",
    "tied_embeddings",
    "update_buckets",
]
