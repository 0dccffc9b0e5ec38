"""HF <-> Megatron-core GPTModel weights, per tensor-parallel rank: names, slices, QKV interleave, vocab padding.

Pure tensor code (torch and safetensors only; no megatron, no torch.distributed), so the engine's loading,
export and weight sync, and the tests, share one definition of the layout. Megatron's layout (megatron-core
0.16 ``GPTModel``; verl's ``verl/models/mcore/weight_converter.py`` and mbridge do the same), for TP rank
``r`` of ``T`` and a pipeline stage whose local layer ``i`` is HF layer ``layer_offset + i``:

* ``embedding.word_embeddings.weight`` / ``output_layer.weight``: rows ``[r*Vp/T, (r+1)*Vp/T)`` of the
  vocabulary zero-padded to ``Vp`` (:func:`verl_megatron.model_config.padded_vocab_size`);
* ``self_attention.linear_qkv.{weight,bias}``: per key/value group ``g`` the rows ``[q of the group's
  heads; k_g; v_g]``, groups ``[r*G/T, (r+1)*G/T)`` on rank ``r``;
* ``self_attention.linear_proj.weight`` / ``mlp.linear_fc2.weight``: row-parallel, column chunk ``r``;
* ``mlp.linear_fc1.weight``: ``[gate chunk r; up chunk r]``;
* norms replicated; the local spec names them ``input_layernorm`` / ``pre_mlp_layernorm``, the Transformer
  Engine spec fuses them into ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``; Qwen3's
  per-head ``q_layernorm`` / ``k_layernorm`` are the same in both.

With tied embeddings and one pipeline stage the model has no ``output_layer.weight``; with several stages
the last one holds a copy of the embedding rows as ``output_layer.weight`` (Megatron keeps the copies equal by
all-reducing their gradients), loaded here from ``lm_head.weight`` or, absent (tied checkpoints do not save
it), from ``model.embed_tokens.weight``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from verl_megatron.model_config import ModelShape

EMBED = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# megatron per-layer suffix -> kind; both layer specs' norm names.
_KINDS = {
    "self_attention.linear_qkv.weight": "qkv",
    "self_attention.linear_qkv.bias": "qkv",
    "self_attention.linear_proj.weight": "row",
    "mlp.linear_fc1.weight": "fc1",
    "mlp.linear_fc2.weight": "row",
    "input_layernorm.weight": "norm",
    "self_attention.linear_qkv.layer_norm_weight": "norm",
    "pre_mlp_layernorm.weight": "norm",
    "mlp.linear_fc1.layer_norm_weight": "norm",
    "self_attention.q_layernorm.weight": "norm",
    "self_attention.k_layernorm.weight": "norm",
}
_HF_SUFFIX = {
    "self_attention.linear_qkv.weight": [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ],
    "self_attention.linear_qkv.bias": ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"],
    "self_attention.linear_proj.weight": ["self_attn.o_proj.weight"],
    "mlp.linear_fc1.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
    "mlp.linear_fc2.weight": ["mlp.down_proj.weight"],
    "input_layernorm.weight": ["input_layernorm.weight"],
    "self_attention.linear_qkv.layer_norm_weight": ["input_layernorm.weight"],
    "pre_mlp_layernorm.weight": ["post_attention_layernorm.weight"],
    "mlp.linear_fc1.layer_norm_weight": ["post_attention_layernorm.weight"],
    "self_attention.q_layernorm.weight": ["self_attn.q_norm.weight"],
    "self_attention.k_layernorm.weight": ["self_attn.k_norm.weight"],
}

# (hf_name, dim, start, stop): the part of a full HF tensor one rank holds; dim None = the whole tensor.
Range = tuple[str, int | None, int, int]
Piece = tuple[str, torch.Tensor, int | None, int, int]


def _split(name: str, shape: ModelShape, layer_offset: int) -> tuple[str, str | None, str]:
    """``(kind, megatron per-layer suffix or None, HF layer prefix)``; KeyError for names we do not map."""
    if name in (EMBED, OUTPUT):
        return "vocab", None, ""
    if name == FINAL_NORM:
        return "norm", None, ""
    m = _LAYER.match(name)
    if m is None or m.group(2) not in _KINDS:
        raise KeyError(f"Megatron weight {name!r} has no HF counterpart in the dense-decoder mapping")
    suffix = m.group(2)
    if suffix.endswith("linear_qkv.bias") and not shape.qkv_bias:
        raise KeyError(f"Megatron weight {name!r}: {shape.architecture} has no q/k/v biases")
    if ("q_layernorm" in suffix or "k_layernorm" in suffix) and not shape.qk_layernorm:
        raise KeyError(f"Megatron weight {name!r}: {shape.architecture} has no q/k layernorm")
    layer = int(m.group(1)) + layer_offset
    if layer >= shape.num_layers:
        raise KeyError(
            f"Megatron weight {name!r} with layer_offset {layer_offset} is layer {layer} of {shape.num_layers}"
        )
    return _KINDS[suffix], suffix, f"model.layers.{layer}."


def hf_names_for(name: str, shape: ModelShape, layer_offset: int) -> list[str]:
    """HF state-dict names held (in part, per TP rank) by Megatron weight ``name``, in HF's order.

    Raises:
        KeyError: ``name`` is not a weight of the mapping (``*._extra_state`` included: filter those out).
    """
    kind, suffix, prefix = _split(name, shape, layer_offset)
    if name == EMBED:
        return ["model.embed_tokens.weight"]
    if name == OUTPUT:
        return ["lm_head.weight"]
    if name == FINAL_NORM:
        return ["model.norm.weight"]
    return [prefix + s for s in _HF_SUFFIX[suffix]]


def hf_state_dict_order(shape: ModelShape, *, include_tied_lm_head: bool = True) -> list[str]:
    """Keys of ``AutoModelForCausalLM.from_config(cfg).state_dict()`` in its order.

    HF's ``state_dict()`` lists ``lm_head.weight`` even when it is tied to the embedding (``save_pretrained``
    drops it); ``include_tied_lm_head=False`` leaves it out for tied models.
    """
    out = ["model.embed_tokens.weight"]
    for i in range(shape.num_layers):
        p = f"model.layers.{i}.self_attn."
        for proj in ("q_proj", "k_proj", "v_proj"):
            out.append(p + proj + ".weight")
            if shape.qkv_bias:
                out.append(p + proj + ".bias")
        out.append(p + "o_proj.weight")
        if shape.qk_layernorm:
            out += [p + "q_norm.weight", p + "k_norm.weight"]
        p = f"model.layers.{i}."
        out += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
        out += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    out.append("model.norm.weight")
    if include_tied_lm_head or not shape.tie_word_embeddings:
        out.append("lm_head.weight")
    return out


def megatron_state_dict_names(
    shape: ModelShape, *, num_local_layers: int, first_stage: bool, last_stage: bool, impl: str = "local"
) -> list[str]:
    """Weight names (no ``_extra_state``) of one pipeline stage's ``GPTModel`` built with layer spec ``impl``."""
    if impl not in ("local", "transformer_engine"):
        raise ValueError(f"transformer_impl={impl!r}: choose 'local' or 'transformer_engine'")
    te = impl == "transformer_engine"
    out = [EMBED] if first_stage else []
    for i in range(num_local_layers):
        p = f"decoder.layers.{i}."
        layer = [] if te else [p + "input_layernorm.weight"]
        if te:
            layer.append(p + "self_attention.linear_qkv.layer_norm_weight")
        layer.append(p + "self_attention.linear_proj.weight")
        layer.append(p + "self_attention.linear_qkv.weight")
        if shape.qkv_bias:
            layer.append(p + "self_attention.linear_qkv.bias")
        if shape.qk_layernorm:
            layer += [p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight"]
        if not te:
            layer.append(p + "pre_mlp_layernorm.weight")
        else:
            layer.append(p + "mlp.linear_fc1.layer_norm_weight")
        layer += [p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
        out += layer
    if last_stage:
        out.append(FINAL_NORM)
        if not (shape.tie_word_embeddings and first_stage):
            out.append(OUTPUT)
    return out


def _check_layout(shape: ModelShape, tp_size: int, tp_rank: int, padded_vocab: int) -> None:
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} is not in [0, tensor_model_parallel_size={tp_size})")
    for what, n in (
        ("num_key_value_heads", shape.num_query_groups),
        ("intermediate_size", shape.ffn_hidden_size),
        ("padded vocab", padded_vocab),
    ):
        if n % tp_size:
            raise ValueError(f"tensor_model_parallel_size={tp_size} does not divide the model's {what} ({n})")
    if padded_vocab < shape.vocab_size:
        raise ValueError(f"padded_vocab {padded_vocab} < vocab_size {shape.vocab_size}")


def _ranges(
    name: str, shape: ModelShape, tp_size: int, tp_rank: int, layer_offset: int, padded_vocab: int
) -> list[Range]:
    """What rank ``tp_rank`` holds of each HF tensor behind ``name``, in the order the pieces are assembled."""
    _check_layout(shape, tp_size, tp_rank, padded_vocab)
    kind, _, _ = _split(name, shape, layer_offset)
    hf = hf_names_for(name, shape, layer_offset)
    r, t = tp_rank, tp_size
    if kind == "vocab":
        rows = padded_vocab // t
        start = min(r * rows, shape.vocab_size)
        return [(hf[0], 0, start, min((r + 1) * rows, shape.vocab_size))]
    if kind == "norm":
        size = shape.head_dim if "q_layernorm" in name or "k_layernorm" in name else shape.hidden_size
        return [(hf[0], None, 0, size)]
    if kind == "qkv":
        n, hd = shape.num_query_groups // t, shape.head_dim
        q = n * shape.heads_per_group * hd
        return [
            (hf[0], 0, r * q, (r + 1) * q),
            (hf[1], 0, r * n * hd, (r + 1) * n * hd),
            (hf[2], 0, r * n * hd, (r + 1) * n * hd),
        ]
    if kind == "fc1":
        f = shape.ffn_hidden_size // t
        return [(hf[0], 0, r * f, (r + 1) * f), (hf[1], 0, r * f, (r + 1) * f)]
    # row-parallel: o_proj has heads*head_dim input columns, down_proj ffn_hidden_size.
    cols = shape.num_attention_heads * shape.head_dim if "linear_proj" in name else shape.ffn_hidden_size
    if cols % t:
        raise ValueError(f"tensor_model_parallel_size={t} does not divide the {cols} input columns of {name}")
    c = cols // t
    return [(hf[0], 1, r * c, (r + 1) * c)]


def _assemble(
    name: str, kind: str, parts: list[torch.Tensor], shape: ModelShape, tp_size: int, padded_vocab: int
) -> torch.Tensor:
    """Megatron's local tensor from this rank's HF parts (in :func:`_ranges` order)."""
    if kind == "qkv":
        n = shape.num_query_groups // tp_size
        rest = parts[0].shape[1:]
        grouped = [p.reshape(n, -1, *rest) for p in parts]  # [groups, rows of the group, (H)]
        return torch.cat(grouped, dim=1).reshape(-1, *rest).contiguous()
    if kind == "fc1":
        return torch.cat(parts, dim=0)
    if kind == "vocab":
        rows = padded_vocab // tp_size
        real = parts[0]
        if real.shape[0] == rows:
            return real.contiguous()
        pad = real.new_zeros((rows - real.shape[0], *real.shape[1:]))
        return torch.cat([real, pad], dim=0)
    return parts[0].contiguous()


def _hf_ranks_pieces(
    name: str, local: torch.Tensor, ranges: list[Range], kind: str, shape: ModelShape, tp_size: int
) -> list[Piece]:
    """Inverse of :func:`_assemble`: the local tensor cut into its HF pieces."""
    if kind == "qkv":
        n = shape.num_query_groups // tp_size
        hd = shape.head_dim
        rest = local.shape[1:]
        per_group = local.reshape(n, (shape.heads_per_group + 2) * hd, *rest)
        q, k, v = per_group.split([shape.heads_per_group * hd, hd, hd], dim=1)
        tensors = [x.reshape(-1, *rest) for x in (q, k, v)]
    elif kind == "fc1":
        tensors = list(local.chunk(2, dim=0))
    elif kind == "vocab":
        _, _, start, stop = ranges[0]
        tensors = [local[: stop - start]]
    else:
        tensors = [local]
    return [(hf, t, dim, start, stop) for (hf, dim, start, stop), t in zip(ranges, tensors, strict=True)]


def _expected_local_shape(
    ranges: list[Range], kind: str, shape: ModelShape, tp_size: int, padded_vocab: int
) -> tuple[int, ...]:
    """Shape of the rank's Megatron tensor: what :func:`_assemble` makes of the pieces in ``ranges``."""
    if kind == "vocab":
        return (padded_vocab // tp_size, shape.hidden_size)
    if kind == "norm":
        return (ranges[0][3],)
    if kind == "row":
        return (shape.hidden_size, ranges[0][3] - ranges[0][2])
    rows = sum(stop - start for _, _, start, stop in ranges)  # qkv / fc1: the pieces stacked on dim 0
    return (rows,) if ranges[0][0].endswith(".bias") else (rows, shape.hidden_size)


def _tensor_getter(get: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor]) -> Callable[[str], torch.Tensor]:
    if isinstance(get, Mapping):

        def lookup(hf_name: str) -> torch.Tensor:
            return get[hf_name]

        return lookup
    return get


def _build(
    wanted: Iterable[str],
    read: Callable[[str, int | None, int, int], torch.Tensor],
    shape: ModelShape,
    tp_size: int,
    tp_rank: int,
    layer_offset: int,
    padded_vocab: int,
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name in wanted:
        if name.endswith("._extra_state"):
            continue
        kind, _, _ = _split(name, shape, layer_offset)
        ranges = _ranges(name, shape, tp_size, tp_rank, layer_offset, padded_vocab)
        parts = []
        for hf_name, dim, start, stop in ranges:
            if name == OUTPUT and hf_name == "lm_head.weight":
                parts.append(_read_lm_head(read, shape, dim, start, stop))
            else:
                parts.append(_read_named(read, name, hf_name, dim, start, stop))
        out[name] = _assemble(name, kind, parts, shape, tp_size, padded_vocab)
    return out


def _read_named(read: Callable, name: str, hf_name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
    try:
        return read(hf_name, dim, start, stop)
    except KeyError:
        raise KeyError(f"HF tensor {hf_name!r} (for Megatron weight {name!r}) is not in the checkpoint") from None


def _read_lm_head(read: Callable, shape: ModelShape, dim: int | None, start: int, stop: int) -> torch.Tensor:
    try:
        return read("lm_head.weight", dim, start, stop)
    except KeyError:
        if not shape.tie_word_embeddings:
            raise KeyError(
                f"HF tensor 'lm_head.weight' (for Megatron weight {OUTPUT!r}) is not in the checkpoint and "
                "tie_word_embeddings is false"
            ) from None
        # Tied checkpoints store only the embedding; the last stage's head is a copy of it.
        return _read_named(read, OUTPUT, "model.embed_tokens.weight", dim, start, stop)


def megatron_shard_from_hf(
    get: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor],
    wanted: Iterable[str],
    shape: ModelShape,
    *,
    tp_size: int,
    tp_rank: int,
    layer_offset: int,
    padded_vocab: int,
) -> dict[str, torch.Tensor]:
    """This TP rank's Megatron tensors for every name in ``wanted`` (``*._extra_state`` skipped), from HF tensors.

    Args:
        get: HF state dict (or ``name -> full tensor``), e.g. ``model.state_dict()``.
        wanted: the stage model's state-dict keys.
        layer_offset: HF index of the stage's local layer 0.
        padded_vocab: the model's (padded) vocab size, a multiple of ``tp_size``.

    Returns:
        ``{name: tensor}`` in the HF dtype, shaped like the rank's parameter (padding rows zero). Tensors may
        share storage with ``get``'s (norms and row-parallel slices of one rank).

    Raises:
        KeyError: a name outside the mapping, or a HF tensor missing (both named).
        ValueError: a layout the model's sizes do not divide.
    """
    getter = _tensor_getter(get)

    def read(hf_name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        full = getter(hf_name)
        return full if dim is None else full.narrow(dim, start, stop - start)

    return _build(wanted, read, shape, tp_size, tp_rank, layer_offset, padded_vocab)


def _safetensors_files(folder: str) -> dict[str, str]:
    """HF name -> safetensors file of a ``save_pretrained`` folder (one file or sharded with an index)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: os.path.join(folder, v) for k, v in weight_map.items()}
    files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors")) if os.path.isdir(folder) else []
    if not files:
        raise FileNotFoundError(
            f"{folder!r} holds no *.safetensors weights: the megatron engine reads only safetensors (.bin "
            "checkpoints are not read); re-save the model with save_pretrained(folder, safe_serialization=True)"
        )
    from safetensors import safe_open

    out: dict[str, str] = {}
    for name in files:
        path = os.path.join(folder, name)
        with safe_open(path, framework="pt") as f:
            out.update(dict.fromkeys(f.keys(), path))
    return out


def load_hf_shard(
    folder: str,
    wanted: Iterable[str],
    shape: ModelShape,
    *,
    tp_size: int,
    tp_rank: int,
    layer_offset: int,
    padded_vocab: int,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """:func:`megatron_shard_from_hf` reading a HF safetensors folder, each rank only its rows/columns.

    Uses ``safe_open(...).get_slice(name)[...]``: a rank reads its slice of each tensor, not the whole tensor.
    Returns tensors cast to ``dtype``.

    Raises:
        FileNotFoundError: no safetensors in ``folder`` (``.bin`` checkpoints are not read).
        KeyError / ValueError: as :func:`megatron_shard_from_hf`.
    """
    from safetensors import safe_open

    where = _safetensors_files(folder)
    handles: dict[str, Any] = {}

    def read(hf_name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        if hf_name not in where:
            raise KeyError(hf_name)
        path = where[hf_name]
        if path not in handles:
            handles[path] = safe_open(path, framework="pt")
        sl = handles[path].get_slice(hf_name)
        if dim is None:
            t = sl[:]
        elif dim == 0:
            t = sl[start:stop]
        else:
            t = sl[:, start:stop]
        return t.to(dtype)

    try:
        return _build(wanted, read, shape, tp_size, tp_rank, layer_offset, padded_vocab)
    finally:
        handles.clear()


def hf_pieces_from_shard(
    name: str,
    tensor: torch.Tensor,
    shape: ModelShape,
    *,
    tp_size: int,
    tp_rank: int,
    layer_offset: int,
    padded_vocab: int,
) -> list[Piece]:
    """This rank's shard of Megatron weight ``name`` as HF-named pieces ``(hf_name, local, dim, start, stop)``.

    ``local`` is ``full_hf.narrow(dim, start, stop - start)`` of the HF tensor (a view of ``tensor``):
    q/k/v, gate/up, embedding and lm_head are dim-0 ranges (vocabulary rows clipped to the real vocab: the
    last rank's piece may be shorter, or empty), o_proj/down_proj dim-1 ranges; replicated norms have dim
    None with ``start, stop = 0, size``.

    Raises:
        KeyError: ``name`` outside the mapping. ValueError: ``tensor`` is not the rank's shape of ``name``.
    """
    kind, _, _ = _split(name, shape, layer_offset)
    ranges = _ranges(name, shape, tp_size, tp_rank, layer_offset, padded_vocab)
    expected = _expected_local_shape(ranges, kind, shape, tp_size, padded_vocab)
    if tuple(tensor.shape) != expected:
        raise ValueError(
            f"Megatron weight {name!r} on tp rank {tp_rank}/{tp_size} has shape {tuple(tensor.shape)}, expected {expected}"
        )
    return _hf_ranks_pieces(name, tensor, ranges, kind, shape, tp_size)


def hf_from_gathered(
    name: str, shards: list[torch.Tensor], shape: ModelShape, *, layer_offset: int, padded_vocab: int
) -> list[tuple[str, torch.Tensor]]:
    """Full HF tensors ``[(hf_name, tensor)]`` from all ``T = len(shards)`` TP shards of ``name`` (rank order).

    Vocabulary padding is removed; replicated norms come from rank 0.
    """
    tp = len(shards)
    if tp == 0:
        raise ValueError(f"no shards given for {name!r}")
    per_rank = [
        hf_pieces_from_shard(
            name, s, shape, tp_size=tp, tp_rank=r, layer_offset=layer_offset, padded_vocab=padded_vocab
        )
        for r, s in enumerate(shards)
    ]
    out = []
    for j, (hf_name, _, dim, _, _) in enumerate(per_rank[0]):
        if dim is None:
            out.append((hf_name, per_rank[0][j][1]))
        else:
            out.append((hf_name, torch.cat([pieces[j][1] for pieces in per_rank], dim=dim)))
    return out
