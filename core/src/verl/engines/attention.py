"""Attention for the reference engines: packed (variable-length) sequences and GQA decode steps.

One function is registered with ``transformers`` under :data:`ATTN_IMPLEMENTATION` and installed on a
model whose attention implementation is ``sdpa`` (:func:`install`). It is a superset of ``sdpa``:

* **Packed sequences** (``use_remove_padding``): a forward over one row ``(1, total_tokens)`` holding
  several sequences back to back, with per-sequence restarting ``position_ids`` and ``cu_seq_lens_q``
  (cumulative sequence lengths, flash-attention's varlen convention, passed as a forward keyword that
  transformers hands down to every attention call). Each sequence attends causally to itself only: one
  ``scaled_dot_product_attention(is_causal=True)`` per sequence, so no ``total x total`` mask exists and
  no padded token is computed. This is the CPU counterpart of verl's flash-attention varlen path
  (``verl/workers/utils/padding.py``, anatomy §5.4).
* **Decode steps** (one query token per row against a KV cache, grouped-query attention): the query
  heads of a group are batched against their shared key/value head, so the cache is read once and never
  copied (``sdpa`` with a padding mask repeats every key/value head ``num_heads / num_kv_heads`` times,
  copying the whole cache on every generated token).
* Everything else (prefill with a padding mask, plain padded batches) calls transformers' own
  ``sdpa_attention_forward`` unchanged.

The registered mask function is ``sdpa``'s, so padded calls get exactly the masks ``sdpa`` gets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

ATTN_IMPLEMENTATION = "verl_sdpa"
_registered: bool | None = None
_sdpa_forward: Callable[..., tuple[torch.Tensor, None]] | None = None  # transformers' sdpa, set on registration


def _register() -> bool:
    """Register the attention and mask functions with transformers once; False if this version cannot."""
    global _registered, _sdpa_forward
    if _registered is None:
        try:
            from transformers import AttentionInterface
            from transformers.integrations.sdpa_attention import sdpa_attention_forward
            from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        except ImportError:  # transformers too old for pluggable attention: engines fall back to padding
            _registered = False
        else:
            _sdpa_forward = sdpa_attention_forward
            AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
            AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
            _registered = True
    return _registered


def install(model: torch.nn.Module) -> bool:
    """Switch ``model`` (and its sub-configs) from ``sdpa`` to this module's attention; idempotent.

    Returns True when the model now runs :func:`attention_forward` (already installed counts), False when it
    uses another implementation (eager, flash, a custom kernel: left untouched) or transformers cannot
    register attention functions. Results of padded calls are unchanged (they run ``sdpa`` itself).
    """
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == ATTN_IMPLEMENTATION:
        return True
    if current != "sdpa" or not _register():
        return False
    try:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    except (AttributeError, ValueError, TypeError) as exc:
        logger.info("cannot install %s attention on %s: %s", ATTN_IMPLEMENTATION, type(model).__name__, exc)
        return False
    return getattr(model.config, "_attn_implementation", None) == ATTN_IMPLEMENTATION


def is_installed(model: torch.nn.Module) -> bool:
    """True when ``model`` runs this module's attention (packed forwards are possible)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == ATTN_IMPLEMENTATION


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function (see the module docstring for the three cases).

    Args:
        query: ``(batch, num_heads, q_len, head_dim)``; key, value: ``(batch, num_kv_heads, kv_len, head_dim)``.
        attention_mask: ``sdpa``'s 4-D boolean mask ``(batch, 1, q_len, kv_len)`` (True = attend) or None.
        kwargs: ``cu_seq_lens_q`` ``(num_seqs + 1,)`` int marks a packed forward (batch must be 1).

    Returns:
        ``(attn_output (batch, q_len, num_heads, head_dim), None)``, as every transformers attention function.

    Raises:
        ValueError: a packed forward with batch > 1 or ``cu_seq_lens_q`` that does not end at ``q_len``.
    """
    cu = kwargs.get("cu_seq_lens_q")
    extra = _unhandled(kwargs)
    if cu is not None:
        if extra:
            raise NotImplementedError(
                f"packed attention does not implement {extra} (used by {type(module).__name__}); "
                "set actor_rollout_ref.model.use_remove_padding=false for this model"
            )
        return _packed(query, key, value, cu, dropout, scaling), None
    groups = query.shape[1] // key.shape[1]
    if not extra and query.shape[2] == 1 and groups >= 1 and query.shape[1] == groups * key.shape[1]:
        return _decode(query, key, value, attention_mask, scaling, groups), None
    return _sdpa_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


# Forward keywords that carry no attention semantics (or are this module's own). Anything else that is set,
# e.g. a soft-cap, attention sinks or a sliding window, is left to sdpa (or refused when packing).
_PLAIN_KWARGS = frozenset(
    {
        "position_ids",
        "use_cache",
        "cache_position",
        "past_key_values",
        "output_attentions",
        "layer_idx",
        "is_causal",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    }
)


def _unhandled(kwargs: dict[str, Any]) -> list[str]:
    return sorted(k for k, v in kwargs.items() if k not in _PLAIN_KWARGS and v is not None and v is not False)


def _packed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    bounds = [int(x) for x in cu_seq_lens.tolist()]
    if bounds[0] != 0 or bounds[-1] != query.shape[2]:
        raise ValueError(f"cu_seq_lens_q {bounds[:3]}...{bounds[-1:]} does not cover the {query.shape[2]} tokens")
    gqa = query.shape[1] != key.shape[1]
    lens = [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True) if end > start]
    # torch.split, not one slice per sequence: the backward of a split is one concatenation, while every
    # slice's backward would materialise a zero-filled gradient of the whole packed row.
    outs = [
        F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa)
        for q, k, v in zip(
            torch.split(query, lens, dim=2), torch.split(key, lens, dim=2), torch.split(value, lens, dim=2), strict=True
        )
    ]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def _decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    groups: int,
) -> torch.Tensor:
    batch, heads, _, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    q = query.reshape(batch, kv_heads, groups, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).mul_(scale)  # (batch, kv_heads, groups, kv_len)
    if attention_mask is not None:
        mask = attention_mask[..., -kv_len:].reshape(batch, 1, 1, kv_len)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs, value)  # (batch, kv_heads, groups, dim)
    return out.reshape(batch, 1, heads, dim)
