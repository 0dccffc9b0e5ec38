"""Token entropy of a policy's next-token distribution, with verl's memory and speed switches.

verl computes the per-token entropy ``H = logsumexp(z) - sum(softmax(z) * z)`` of the (temperature-scaled)
logits ``z`` with one of two functions from ``verl/utils/torch_functional.py`` and wraps it according to
three actor/ref keys (``verl/workers/engine/fsdp/transformer_impl.py``, and the legacy ``dp_actor.py``):

* ``entropy_from_logits_with_chunking``: :func:`entropy_from_logits_with_chunking` instead of
  :func:`entropy_from_logits`: the softmax is formed for ``entropy_from_logits_chunk_size`` rows at a time,
  so the extra ``(rows, vocab)`` float32 buffers exist for one chunk only;
* ``use_torch_compile`` (verl default ``true``): the chosen function goes through
  ``torch.compile(fn, dynamic=True)`` (one graph for every row count);
* ``entropy_checkpointing``: when the entropy takes part in the loss, its forward runs under
  ``torch.utils.checkpoint`` (non-reentrant), so the softmax is recomputed in backward instead of kept.

:func:`make_entropy_fn` builds the one callable an engine uses. All variants give the same values up to float
rounding; the tests compare them with the plain formula.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.utils.checkpoint

EntropyFn = Callable[[torch.Tensor], torch.Tensor]

DEFAULT_CHUNK_SIZE = 2048  # verl's entropy_from_logits_chunk_size default


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of ``softmax(logits)`` over the last dim (verl ``torch_functional.entropy_from_logits``).

    Args:
        logits: ``(..., vocab)`` unnormalised log-probabilities, any float dtype.

    Returns:
        ``(...)`` entropy in nats, the dtype of ``logits``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """:func:`entropy_from_logits` computed ``chunk_size`` rows at a time, each chunk in float32.

    Peak extra memory is one ``(chunk_size, vocab)`` float32 softmax instead of one per row of ``logits``
    (verl ``torch_functional.entropy_from_logits_with_chunking``; like verl it returns float32).

    Args:
        logits: ``(..., vocab)``; leading dims are flattened into rows.
        chunk_size: rows per chunk (>= 1).

    Returns:
        ``(...)`` float32 entropy in nats; differentiable (each chunk's slice is written with autograd).

    Raises:
        ValueError: ``chunk_size < 1``.
    """
    if chunk_size < 1:
        raise ValueError(f"entropy_from_logits_chunk_size must be >= 1, got {chunk_size}")
    lead = logits.shape[:-1]
    rows = logits.reshape(-1, logits.shape[-1])
    chunks = [entropy_from_logits(rows[i : i + chunk_size].float()) for i in range(0, rows.shape[0], chunk_size)]
    if not chunks:
        return rows.new_zeros(lead, dtype=torch.float32)
    return torch.cat(chunks).reshape(lead)


def make_entropy_fn(
    *,
    chunking: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    use_torch_compile: bool = False,
    checkpointing: bool = False,
) -> EntropyFn:
    """The entropy function of one engine, from verl's switches (see the module docstring).

    Args:
        chunking: ``entropy_from_logits_with_chunking``.
        chunk_size: ``entropy_from_logits_chunk_size`` (rows per chunk; only with ``chunking``).
        use_torch_compile: ``use_torch_compile``: compile the function (``dynamic=True``, as verl).
        checkpointing: ``entropy_checkpointing``: recompute it in backward; only acts when autograd records.

    Returns:
        ``fn(logits (..., vocab)) -> (...)`` entropy; float32 whenever ``logits`` is float32 or ``chunking``.

    Raises:
        ValueError: ``chunk_size < 1`` with ``chunking``.
    """
    if chunking and chunk_size < 1:
        raise ValueError(f"entropy_from_logits_chunk_size must be >= 1, got {chunk_size}")

    def chunked(logits: torch.Tensor) -> torch.Tensor:
        return entropy_from_logits_with_chunking(logits, chunk_size)

    fn: EntropyFn = chunked if chunking else entropy_from_logits
    if use_torch_compile:
        fn = _lazily_compiled(fn)
    if not checkpointing:
        return fn
    inner = fn

    def checkpointed(logits: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and logits.requires_grad):
            return inner(logits)  # nothing is saved for backward, so there is nothing to recompute
        return torch.utils.checkpoint.checkpoint(inner, logits, use_reentrant=False)

    return checkpointed


def _lazily_compiled(fn: EntropyFn) -> EntropyFn:
    """``torch.compile(fn, dynamic=True)``, wrapped on the first call (importing the compiler costs seconds)."""
    compiled: list[EntropyFn] = []

    def call(logits: torch.Tensor) -> torch.Tensor:
        if not compiled:
            compiled.append(torch.compile(fn, dynamic=True))
        return compiled[0](logits)

    return call
