"""One micro-batch through Megatron's GPTModel: inputs in Megatron's layout, response log-probs and entropy.

Megatron's RoPE uses positions ``0..s-1`` and ignores ``position_ids`` (``backends.md``), so rows are
converted from verl's layout (left-padded prompt, right-padded response) to right padding: each row's real
tokens move to the front in order, and a ``[b, 1, s, s]`` boolean mask (True = masked) joins the causal mask with
the key padding. A prompt of ``p`` real tokens then scores its response token ``t`` at position ``p - 1 + t``,
the same logit the reference engine reads (DESIGN §5).

Log-probs and entropy are computed over the vocabulary split across the tensor-parallel group without gathering
the logits (verl: ``vocab_parallel_log_probs_from_logits`` and ``vocab_parallel_entropy``): a detached max is
all-reduced, the softmax sums go through Megatron's autograd-aware all-reduce, so each rank's gradient is that of
its own vocabulary slice. Vocabulary padding columns (added so the vocabulary splits evenly) are masked out.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

# Padding columns get this logit: exp() underflows to 0 and 0 * it stays 0 (finfo.min - max would be -inf).
_MASKED = -1e30


@attrs.frozen
class MegatronInputs:
    """A micro-batch in Megatron's layout.

    Attributes:
        input_ids: ``(b, s)`` int64, right-padded.
        position_ids: ``(b, s)`` int64, ``0..s-1`` on every row (what Megatron's RoPE uses anyway).
        attention_mask: ``(b, 1, s, s)`` bool, True where attention is masked (future or padding keys).
        score_index: ``(b, resp_len)`` int64: position whose logit scores response token ``t`` (clamped).
        response_valid: ``(b, resp_len)`` bool: the response token exists.
        labels: ``(b, resp_len)`` int64: the response tokens.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    score_index: torch.Tensor
    response_valid: torch.Tensor
    labels: torch.Tensor

    def scored_in_place(self) -> MegatronInputs:
        """These inputs for an output that holds only the scored positions (column ``t`` scores token ``t``)."""
        b, resp_len = self.score_index.shape
        index = torch.arange(resp_len, device=self.score_index.device).unsqueeze(0).expand(b, -1)
        return attrs.evolve(self, score_index=index)


def to_megatron_inputs(batch: Any, device: torch.device, pad_to: int | None = None) -> MegatronInputs:
    """Convert a verl micro-batch (``input_ids``, ``attention_mask`` ``(b, P + R)``, ``responses`` ``(b, R)``).

    Args:
        batch: mapping with those keys (a TensorDict slice of a DataProto).
        device: where the result lives.
        pad_to: pad the sequence dim to at least this length (``pad_bshd_to_minibatch_max``); None = the longest row.
    """
    input_ids = batch["input_ids"].to(device)
    mask = batch["attention_mask"].to(device).bool()
    responses = batch["responses"].to(device)
    b, total = input_ids.shape
    resp_len = responses.shape[1]
    prompt_len = total - resp_len
    # Stable sort of "is padding" moves every row's real tokens to the front, in order.
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    lengths = mask.sum(-1)
    seq = max(int(lengths.max()) if b else 1, 1, int(pad_to or 0))
    ids = (
        input_ids.gather(1, order)[:, :seq]
        if seq <= total
        else torch.nn.functional.pad(input_ids.gather(1, order), (0, seq - total))
    )
    keep = torch.arange(seq, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    ids = torch.where(keep, ids, torch.zeros_like(ids))
    prompt_real = mask[:, :prompt_len].sum(-1)
    t = torch.arange(resp_len, device=device).unsqueeze(0)
    score_index = (prompt_real.unsqueeze(1) - 1 + t).clamp(0, seq - 1)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)
    attention = causal.unsqueeze(0) | ~keep.unsqueeze(1)  # (b, s_q, s_k)
    return MegatronInputs(
        input_ids=ids,
        position_ids=torch.arange(seq, device=device).unsqueeze(0).expand(b, -1),
        attention_mask=attention.unsqueeze(1),
        score_index=score_index,
        response_valid=mask[:, prompt_len:],
        labels=responses,
    )


def vocab_parallel_stats(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    temperature: float,
    calculate_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``labels`` and entropy under ``softmax(logits / temperature)`` over the TP-split vocabulary.

    Args:
        logits: ``(..., V_local)`` this rank's vocabulary columns ``[vocab_start, vocab_start + V_local)``.
        labels: ``(...)`` int64 token ids in the full vocabulary.
        vocab_start: first global column of this rank's slice.
        vocab_size: real vocabulary size; columns at or beyond it are padding and masked out.
        temperature: > 0; logits are divided by it (K09).
        calculate_entropy / entropy_grad: also return the entropy (with or without an autograd graph).

    Returns:
        ``(log_probs, entropy or None)``, float32 ``(...)``; equal on every rank of the TP group.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    local = logits.float() / temperature
    width = local.shape[-1]
    if vocab_start + width > vocab_size:  # this slice holds padding columns
        cols = torch.arange(vocab_start, vocab_start + width, device=local.device)
        local = torch.where(cols < vocab_size, local, torch.full_like(local, _MASKED))
    peak = local.detach().amax(dim=-1)
    if ps.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    shifted = local - peak.unsqueeze(-1)
    exp = shifted.exp()
    total = reduce_from_tensor_model_parallel_region(exp.sum(-1))
    log_total = total.log()
    index = labels - vocab_start
    inside = (index >= 0) & (index < width)
    picked = shifted.gather(-1, index.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
    picked = reduce_from_tensor_model_parallel_region(torch.where(inside, picked, torch.zeros_like(picked)))
    log_probs = picked - log_total
    if not calculate_entropy:
        return log_probs, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = exp / total.unsqueeze(-1)
        entropy = log_total - reduce_from_tensor_model_parallel_region((probs * shifted).sum(-1))
    return log_probs, entropy


def response_stats(
    logits: torch.Tensor,
    inputs: MegatronInputs,
    *,
    vocab_start: int,
    vocab_size: int,
    temperature: float,
    calculate_entropy: bool,
    entropy_grad: bool = True,
) -> dict[str, torch.Tensor]:
    """``{"log_probs", "entropys"}`` ``(b, resp_len)`` float32 from the last stage's logits ``(b, s, V_local)``;
    0 where the response is padding (as the reference engine)."""
    index = inputs.score_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    selected = logits.gather(1, index)
    log_probs, entropy = vocab_parallel_stats(
        selected,
        inputs.labels,
        vocab_start=vocab_start,
        vocab_size=vocab_size,
        temperature=temperature,
        calculate_entropy=calculate_entropy,
        entropy_grad=entropy_grad,
    )
    valid = inputs.response_valid
    out = {"log_probs": torch.where(valid, log_probs, torch.zeros_like(log_probs))}
    if entropy is not None:
        out["entropys"] = torch.where(valid, entropy, torch.zeros_like(entropy))
    return out
