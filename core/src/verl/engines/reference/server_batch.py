"""The ``hf`` server's running batch: a KV cache whose rows can be merged and dropped while decoding.

:class:`~verl.engines.reference.server.HFRolloutServer` keeps one running batch. Requests that arrive while
it decodes are prefilled together into a cache of their own and then merged into the running cache; rows
that finish are dropped. All rows of a batch share the sequence axis, aligned on the right (the newest
position is the last column for every row): a shorter cache is padded with zeros on the left of that axis
and the caller pads the attention mask with zeros to match, so the padded positions get no attention weight
(exactly as the left padding of a prompt batch). Columns that are padding for every remaining row are cut
off when rows are dropped, so a batch never costs more than its longest live row.

Each layer keeps ``(batch, kv_heads, capacity, head_dim)`` buffers written in place (as
:mod:`~verl.engines.reference.kv_cache`'s preallocated layers, no ``torch.cat`` per token); the capacity is
set at each merge to what the rows can still use and doubles if a write would overflow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def unsupported_reason(config: Any) -> str | None:
    """Why a model cannot use this cache (None when it can).

    Only full-attention layers are supported: a sliding-window or linear-attention layer keeps a state that
    depends on each row's own length, which left-padded merging cannot line up. transformers < 4.56 has no
    layered cache API.
    """
    try:
        from transformers.cache_utils import Cache, DynamicLayer  # noqa: F401
    except ImportError:
        return "the installed transformers has no layered KV-cache API (transformers >= 4.56 has)"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return f"the model has non-full-attention layers ({sorted(set(layer_types) - {'full_attention'})})"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"the model uses sliding-window attention (sliding_window={config.sliding_window})"
    return None


def new_cache(config: Any, capacity: int) -> Any:
    """An empty transformers ``Cache`` of :func:`layer_class` layers for a prefill (one per decoder layer).

    Args:
        config: the model's ``PretrainedConfig`` (``num_hidden_layers`` is read).
        capacity: positions to reserve per row (prompt width + tokens to come); more grow the buffers.
    """
    from transformers.cache_utils import Cache

    cls = layer_class()
    return Cache(layers=[cls(capacity) for _ in range(int(config.num_hidden_layers))])


def merge(running: Any, new: Any, capacity: int) -> Any:
    """The rows of ``running`` then those of ``new`` in one cache; each side right-aligned, zero-padded left.

    Args:
        running / new: caches from :func:`new_cache` (or earlier merges), same number of layers.
        capacity: positions per row of the result (raised to the longer side's length if smaller).

    Returns:
        A new cache of ``len(running rows) + len(new rows)`` rows and ``max`` of the two lengths; the caller
        pads the attention masks the same way (``[zeros(width - own width) | own mask]``).
    """
    from transformers.cache_utils import Cache

    cls = layer_class()
    merged = []
    for old, add in zip(running.layers, new.layers, strict=True):
        length = max(old.length, add.length)
        out = cls(max(int(capacity), length))
        out.fill([(old.keys, old.values), (add.keys, add.values)], length)
        merged.append(out)
    return Cache(layers=merged)


def select(cache: Any, indices: torch.Tensor, drop_left: int = 0) -> None:
    """Keep only rows ``indices`` (1-D int64) and cut the first ``drop_left`` positions, in place."""
    for layer in cache.layers:
        layer.select(indices, drop_left)


class RunningBatch:
    """The running batch of :class:`~verl.engines.reference.server.HFRolloutServer`: one entry per row in
    every tensor, rows right-aligned on the sequence axis.

    ``rows`` are the server's requests (read: ``tokens``, ``max_tokens``, ``max_draws``, ``uniforms``);
    ``cache`` their KV cache (:func:`new_cache` / :func:`merge`); ``mask`` ``(bs, width)`` int64 covers the
    cached positions (``width`` = the cache's length); ``next_pos`` ``(bs,)`` int64 is the position of the
    token to feed next; ``logits`` ``(bs, vocab)`` are the logits its next token is chosen from; ``uniforms``
    ``(bs, draws)`` float32 the rows' sampler draws (zeros for greedy rows and past a row's own draws).
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows: list[Any] = []
        self.cache: Any = None
        self.mask = self.next_pos = self.logits = self.uniforms = torch.empty(0)

    def add(self, rows: list[Any], cache: Any, mask: torch.Tensor, next_pos: torch.Tensor, logits: Any) -> None:
        """Append freshly prefilled ``rows`` (their ``cache``, ``mask`` ``(n, w)``, ``next_pos``, ``logits``)."""
        draws = max(r.max_draws for r in rows)
        uniforms = torch.stack([_pad_right(r.uniforms, draws) for r in rows])
        if not self.rows:
            self.rows, self.cache, self.mask, self.next_pos, self.logits = rows, cache, mask, next_pos, logits
            self.uniforms = uniforms
            return
        width = max(self.mask.shape[1], mask.shape[1])
        headroom = max(r.max_tokens - len(r.tokens) for r in self.rows + rows)
        self.cache = merge(self.cache, cache, width + headroom)
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.logits = torch.cat([self.logits, logits])
        draws = max(self.uniforms.shape[1], uniforms.shape[1])
        self.uniforms = torch.cat([_pad_right(self.uniforms, draws), _pad_right(uniforms, draws)])
        self.rows = self.rows + rows

    def keep(self, keep: list[int]) -> None:
        """Keep rows ``keep`` only; cut the columns that are padding for every remaining row."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        used = mask.bool().any(dim=0)
        drop = int(used.long().argmax()) if bool(used.any()) else 0
        select(self.cache, index, drop)
        self.mask = mask[:, drop:]
        self.next_pos = self.next_pos.index_select(0, index)
        self.logits = self.logits.index_select(0, index)
        self.uniforms = self.uniforms.index_select(0, index)
        self.rows = [self.rows[i] for i in keep]


def _pad_left(mask: torch.Tensor, width: int) -> torch.Tensor:
    extra = width - mask.shape[1]
    return torch.cat([mask.new_zeros(mask.shape[0], extra), mask], dim=1) if extra else mask


def _pad_right(values: torch.Tensor, length: int) -> torch.Tensor:
    extra = length - values.shape[-1]
    return torch.cat([values, values.new_zeros(*values.shape[:-1], extra)], dim=-1) if extra else values


_LAYER_CLASS: type | None = None


def layer_class() -> type:
    """The ``DynamicLayer`` subclass holding one layer's mergeable buffers (built on first use)."""
    global _LAYER_CLASS
    if _LAYER_CLASS is None:
        from transformers.cache_utils import DynamicLayer

        class MergeableLayer(DynamicLayer):  # type: ignore[misc, valid-type]
            """Keys and values ``(batch, kv_heads, capacity, head_dim)``; positions ``[0, length)`` are filled."""

            is_croppable = False

            def __init__(self, capacity: int) -> None:
                super().__init__()
                self.capacity = max(1, int(capacity))
                self.length = 0

            def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
                self._allocate(key_states, value_states, key_states.shape[0])

            def _allocate(self, keys: torch.Tensor, values: torch.Tensor, batch: int) -> None:
                self.dtype, self.device = keys.dtype, keys.device
                # Zeros, not empty: merged rows' left padding is read by attention (with zero weight), and
                # uninitialised memory may hold NaN, which a zero weight does not cancel.
                self._k = keys.new_zeros(batch, keys.shape[1], self.capacity, keys.shape[-1])
                self._v = values.new_zeros(batch, values.shape[1], self.capacity, values.shape[-1])
                self.is_initialized = True

            def _views(self) -> None:
                self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

            def fill(self, parts: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
                batch = sum(k.shape[0] for k, _ in parts)
                self._allocate(parts[0][0], parts[0][1], batch)
                row = 0
                for keys, values in parts:
                    n, own = keys.shape[0], keys.shape[2]
                    self._k[row : row + n, :, length - own : length] = keys
                    self._v[row : row + n, :, length - own : length] = values
                    row += n
                self.length = length
                self._views()

            def update(
                self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
            ) -> tuple[torch.Tensor, torch.Tensor]:
                if not self.is_initialized:
                    self.lazy_initialization(key_states, value_states)
                end = self.length + key_states.shape[-2]
                if end > self.capacity:
                    self._grow(max(end, 2 * self.capacity))
                self._k[:, :, self.length : end] = key_states
                self._v[:, :, self.length : end] = value_states
                self.length = end
                self._views()
                return self.keys, self.values

            def _grow(self, capacity: int) -> None:
                old_k, old_v, n = self._k, self._v, self.length
                self.capacity = capacity
                self._allocate(old_k, old_v, old_k.shape[0])
                self._k[:, :, :n] = old_k[:, :, :n]
                self._v[:, :, :n] = old_v[:, :, :n]

            def select(self, indices: torch.Tensor, drop_left: int) -> None:
                if not self.is_initialized:
                    return
                n = self.length
                for name in ("_k", "_v"):
                    old = getattr(self, name)
                    new = old.new_empty(len(indices), old.shape[1], self.capacity - drop_left, old.shape[-1])
                    new[:, :, : n - drop_left] = old[:, :, drop_left:n].index_select(0, indices.to(old.device))
                    setattr(self, name, new)
                self.capacity -= drop_left
                self.length = n - drop_left
                self._views()

            def get_seq_length(self) -> int:
                return self.length

            def batch_select_indices(self, indices: torch.Tensor) -> None:
                self.select(indices, 0)

            def reset(self) -> None:
                self.length = 0
                self.keys = self.values = None
                self.is_initialized = False

        _LAYER_CLASS = MergeableLayer
    return _LAYER_CLASS


__all__ = ["RunningBatch", "layer_class", "merge", "new_cache", "select", "unsupported_reason"]
