"""Log-probs and entropy straight from hidden states, without the full logits (``model.use_fused_kernels``).

verl's ``use_fused_kernels`` with ``fused_kernel_options.impl_backend=torch`` replaces the causal LM's
forward so that the LM head, the log-softmax and the entropy run together, ``chunk_size`` tokens at a time
(``verl/utils/experimental/torch_functional.py:FusedLinearForPPOFunction``, installed by
``verl/models/transformers/dense_common.py:forward_with_torch_backend``). Only one chunk's
``(chunk, vocab)`` logits exist at any moment, in forward and in backward (which recomputes them), instead of
``(tokens, vocab)`` float32 logits, softmax and their gradients.

Per token ``t`` with hidden state ``h_t``, head weight ``W`` ``(vocab, hidden)``, label ``y_t`` and temperature
``T``: ``z = (h_t W^T) / T`` (float32), ``log_prob = z_y - logsumexp(z)``, ``entropy = logsumexp(z) - p . z``.
Backward per chunk: ``dz = g_lp (onehot(y) - p) - g_H p (log p + H)``, then ``dh = (dz / T) W`` and
``dW += (dz / T)^T h`` (verl's ``_fused_linear_for_ppo_bwd``).
"""

from __future__ import annotations

import types
from typing import Any

import torch

DEFAULT_CHUNK_SIZE = 512  # verl's FusedLinearForPPO default


def _chunk_stats(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float) -> tuple:
    z = (h @ weight.t()).float() / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    probs = logp_all.exp()
    log_probs = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = torch.logsumexp(z, dim=-1) - (probs * z).sum(-1)
    return log_probs, entropy, probs, logp_all


class FusedLinearForPPOFunction(torch.autograd.Function):
    """Autograd function: ``(hidden (N, H), weight (V, H), labels (N,))`` -> ``(log_probs (N,), entropy (N,))``.

    Both outputs are float32; ``temperature`` (> 0) divides the logits, ``chunk_size`` (>= 1) tokens are
    processed at a time. Gradients flow to ``hidden`` and ``weight`` (either may be frozen).
    """

    @staticmethod
    def forward(ctx: Any, hidden, weight, labels, temperature: float, chunk_size: int):  # noqa: D102
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        with torch.no_grad():
            for start in range(0, n, chunk_size):
                part = slice(start, start + chunk_size)
                log_probs[part], entropy[part], _, _ = _chunk_stats(hidden[part], weight, labels[part], temperature)
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, d_log_probs, d_entropy):  # noqa: D102
        hidden, weight, labels = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        d_hidden = torch.zeros_like(hidden) if want_h else None
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        if d_log_probs is None and d_entropy is None:
            return d_hidden, d_weight, None, None, None
        for start in range(0, hidden.shape[0], chunk_size):
            part = slice(start, start + chunk_size)
            h, y = hidden[part], labels[part]
            _, ent, probs, logp_all = _chunk_stats(h, weight, y, temperature)
            dz = torch.zeros_like(probs)
            if d_log_probs is not None:
                onehot = torch.zeros_like(probs).scatter_(-1, y.unsqueeze(-1), 1.0)
                dz += d_log_probs[part].float().unsqueeze(-1) * (onehot - probs)
            if d_entropy is not None:
                dz -= d_entropy[part].float().unsqueeze(-1) * probs * (logp_all + ent.unsqueeze(-1))
            dz = dz / temperature
            if want_h:
                d_hidden[part] = (dz @ weight.float()).to(hidden.dtype)
            if want_w:
                d_weight += dz.t() @ h.float()
        return d_hidden, None if d_weight is None else d_weight.to(weight.dtype), None, None, None


def fused_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``labels`` and entropy under ``softmax(hidden @ weight.T / temperature)``, chunked.

    Args:
        hidden: ``(..., hidden)`` final hidden states (after the model's last norm).
        weight: ``(vocab, hidden)`` LM-head weight.
        labels: ``(...)`` int token ids, the shape of ``hidden`` without its last dim.
        temperature: > 0.
        chunk_size: tokens per chunk, >= 1.

    Returns:
        ``(log_probs, entropy)``, each ``(...)`` float32.

    Raises:
        ValueError: mismatched shapes, ``temperature <= 0`` or ``chunk_size < 1``.
    """
    if hidden.shape[:-1] != labels.shape or hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"fused log-probs: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and labels "
            f"{tuple(labels.shape)} do not match ((..., H), (V, H), (...))"
        )
    if not temperature > 0 or chunk_size < 1:
        raise ValueError(f"fused log-probs need temperature > 0 and chunk_size >= 1, got {temperature}, {chunk_size}")
    lead = labels.shape
    log_probs, entropy = FusedLinearForPPOFunction.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1).long(), float(temperature), int(chunk_size)
    )
    return log_probs.reshape(lead), entropy.reshape(lead)


def check_fusable(model: torch.nn.Module) -> None:
    """Refuse a causal LM whose logits are not just ``hidden @ lm_head.weight.T`` (the fused path assumes it).

    Raises:
        ValueError: no output embedding / base model, a biased head, logit soft-capping or a logit scale,
            naming the model and ``use_fused_kernels=false``; a LoRA-wrapped head (``lm_head`` in
            ``target_modules``), naming ``exclude_modules=[lm_head]`` as the fix.
    """
    name = type(model).__name__
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, getattr(model, "base_model_prefix", "") or "model", None)
    cfg = getattr(model, "config", None)
    why = None
    # peft's LoRA layer wraps the head (``base_layer`` + ``lora_A``): it is no nn.Linear, and the fused path
    # reads only ``weight``, so it would silently drop the adapter's B @ A term. Name the cause and the fix.
    if getattr(head, "base_layer", None) is not None and hasattr(head, "lora_A"):
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=true: the LM head of {name} carries LoRA adapters "
            "(actor_rollout_ref.model.target_modules names lm_head), and the fused log-prob path uses the plain "
            "head weight only; set actor_rollout_ref.model.exclude_modules=[lm_head] (or drop lm_head from "
            "target_modules; 'all-linear' already leaves it out), or actor_rollout_ref.model.use_fused_kernels=false"
        )
    if not isinstance(head, torch.nn.Linear) or base is None or base is model:
        why = "it has no plain linear LM head over a base model"
    elif head.bias is not None:
        why = "its LM head has a bias"
    elif getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        why = "its logits are soft-capped or scaled after the LM head"
    if why:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=true: {name} cannot use the fused log-prob path because "
            f"{why}; set actor_rollout_ref.model.use_fused_kernels=false"
        )


def _fused_forward(
    self: torch.nn.Module,
    *args: Any,
    select: int | torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    temperature: float | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    **model_inputs: Any,
) -> Any:
    if labels is None:
        # A plain call (no labels): the model's own forward. The hf rollout shares this module with the actor
        # (hybrid engine, share_module) and generates through it, so the patch must not break ordinary calls.
        return self._verl_plain_forward(*args, **model_inputs)
    if args or select is None or temperature is None:
        raise TypeError("the fused forward takes keyword inputs with select=, labels= and temperature=")
    base = getattr(self, self.base_model_prefix)
    hidden = base(**model_inputs, use_cache=False).last_hidden_state
    # The hidden state at position p scores token p + 1 (as the logits do in the plain path).
    hidden = hidden[:, -select - 1 : -1] if isinstance(select, int) else hidden[0, select]
    weight = self.get_output_embeddings().weight
    return fused_log_probs_and_entropy(hidden, weight, labels, temperature, chunk_size)


def install_fused_forward(model: torch.nn.Module) -> None:
    """Give ``model`` (this instance only) a forward returning ``(log_probs, entropy)`` instead of logits.

    The new ``model(select=..., labels=..., temperature=..., **inputs)`` runs the base model, keeps the hidden
    states at ``select`` (an int ``k``: the last ``k + 1`` positions but the final one, per row; a 1-D index
    tensor: those positions of the single packed row) and applies :func:`fused_log_probs_and_entropy` with the
    output embedding. A call without ``labels`` runs the model's original forward (logits), so a rollout engine
    sharing the module (the ``hf`` rollout in the hybrid engine) still generates with it. Patching the instance
    (not the class, as verl does) keeps other models of the class intact
    and keeps module hooks (FSDP2's all-gathers) around the call.

    Raises:
        ValueError: :func:`check_fusable` refuses the model.
    """
    check_fusable(model)
    if not hasattr(model, "_verl_plain_forward"):  # installing twice must not wrap the fused forward itself
        model._verl_plain_forward = model.forward
    model.forward = types.MethodType(_fused_forward, model)
