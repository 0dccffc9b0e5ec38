"""Response log-probs and entropy of one micro-batch: the forward of the reference training engine.

A mixin of :class:`verl.engines.reference.training.ReferenceTrainingEngine` (and so of every engine built on
it, e.g. verl-fsdp's). It reads the engine's ``model``, ``device``, ``settings`` and picks one of three ways
to turn the model's output into per-token numbers (DESIGN §5: logits divided by the rollout temperature,
response token ``t`` scored at input position ``prompt_len - 1 + t``):

* plain: the logits of the response positions, ``log_softmax`` + gather, and the entropy function of
  :func:`verl.engines.entropy.make_entropy_fn` (verl's ``use_torch_compile``,
  ``entropy_from_logits_with_chunking``, ``entropy_checkpointing``);
* fused (``model.use_fused_kernels``): the hidden states go through
  :func:`verl.engines.fused_linear.fused_log_probs_and_entropy`, so no ``(tokens, vocab)`` logits exist;
* either of them on a packed row (``model.use_remove_padding``, :mod:`verl.engines.packing`).

``model.enable_activation_offload`` keeps what the forward saves for backward in host memory
(``torch.autograd.graph.save_on_cpu``), as verl's ``verl/utils/activation_offload.py`` does per layer.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import torch

from verl.engines.entropy import make_entropy_fn
from verl.engines.fused_linear import install_fused_forward
from verl.engines.micro_batch import trim_padding
from verl.engines.packing import pack_batch, packed_forward_kwargs

logger = logging.getLogger(__name__)


class LogProbForward:
    """``forward_micro_batch``: response log-probs (and entropy) of one micro-batch, with grad if enabled."""

    model: torch.nn.Module
    device: torch.device
    settings: Any
    _packed: bool
    _logits_to_keep: bool

    def _setup_log_probs(self) -> None:
        """Build the entropy function and, with ``use_fused_kernels``, patch the model (call after loading it).

        Raises:
            ValueError: an unsupported ``fused_kernels_backend``, or a model the fused path cannot take.
        """
        s = self.settings
        self._entropy_fn = make_entropy_fn(
            chunking=s.entropy_from_logits_with_chunking,
            chunk_size=s.entropy_from_logits_chunk_size,
            use_torch_compile=s.use_torch_compile,
            checkpointing=s.entropy_checkpointing,
        )
        self._fused = bool(s.use_fused_kernels)
        if self._fused:
            if s.fused_kernels_backend != "torch":
                raise ValueError(
                    f"actor_rollout_ref.model.fused_kernel_options.impl_backend={s.fused_kernels_backend!r}: only "
                    "'torch' (chunked PyTorch) is built; set it to torch"
                )
            install_fused_forward(self.model)
        if s.enable_activation_offload and self.device.type == "cpu":
            logger.info("enable_activation_offload: activations already live in host memory on the cpu device")

    def _offload_context(self) -> contextlib.AbstractContextManager:
        if self.settings.enable_activation_offload and torch.is_grad_enabled():
            return torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")
        return contextlib.nullcontext()

    def forward_micro_batch(
        self, batch: Any, temperature: float, *, calculate_entropy: bool = False, entropy_grad: bool = True
    ) -> dict[str, torch.Tensor]:
        """Response log-probs (and entropy) of one micro-batch, with grad if enabled.

        Args:
            batch: mapping with ``input_ids``, ``attention_mask``, ``position_ids``
                ``(bs, prompt_len + resp_len)`` and ``responses`` ``(bs, resp_len)``.
            temperature: rollout temperature; logits are divided by it (K09). Must be > 0.
            calculate_entropy: also return ``entropys``.
            entropy_grad: with False the entropy is computed without an autograd graph (a metric only).

        Returns:
            ``{"log_probs": (bs, resp_len) float32, "entropys": (bs, resp_len) float32}``;
            0 wherever the response is padding.

        Raises:
            ValueError: if ``temperature`` is not a positive finite number.
        """
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be > 0 to compute log-probs, got {temperature!r}")
        responses = batch["responses"].to(self.device)
        bs, resp_len = responses.shape
        with self._offload_context():
            if self._packed:
                packed = pack_batch(
                    batch["input_ids"].to(self.device),
                    batch["attention_mask"].to(self.device),
                    batch["position_ids"].to(self.device),
                    responses,
                )
                if packed is not None:
                    return self._forward_packed(packed, temperature, calculate_entropy, entropy_grad)
            return self._forward_padded(batch, responses, temperature, calculate_entropy, entropy_grad)

    def _forward_padded(
        self, batch: Any, responses: torch.Tensor, temperature: float, calculate_entropy: bool, entropy_grad: bool
    ) -> dict[str, torch.Tensor]:
        bs, resp_len = responses.shape
        input_ids, attention_mask, position_ids, _, kept = trim_padding(
            batch["input_ids"].to(self.device),
            batch["attention_mask"].to(self.device),
            batch["position_ids"].to(self.device),
            resp_len,
        )
        pad = torch.zeros(bs, resp_len - kept, dtype=torch.float32, device=self.device)
        if kept == 0:  # every response in this micro-batch is empty
            out = {"log_probs": pad}
            if calculate_entropy:
                out["entropys"] = pad.clone()
            return out
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        labels = responses[:, :kept]
        if self._fused:
            log_probs, entropy = self.model(**inputs, select=kept, labels=labels, temperature=temperature)
        else:
            # The logit at position p scores token p+1, so the response slice starts one column early.
            # Only those kept + 1 positions go through the LM head: with a 49k vocabulary the head costs
            # about as much as the rest of a small model, so skipping the prompt positions matters.
            extra = {"logits_to_keep": kept + 1} if self._logits_to_keep else {}
            logits = self.model(**inputs, **extra).logits[:, -kept - 1 : -1, :]
            log_probs, entropy = self._stats_from_logits(logits, labels, temperature, calculate_entropy, entropy_grad)
        # Padding slots hold 0 (not the pad token's log-prob) so no consumer can pick them up by mistake.
        valid = attention_mask[:, input_ids.shape[1] - kept :].bool()
        out = {"log_probs": torch.cat([torch.where(valid, log_probs, 0.0), pad], dim=1)}
        if calculate_entropy:
            entropy = entropy if entropy_grad else entropy.detach()
            out["entropys"] = torch.cat([torch.where(valid, entropy, 0.0), pad], dim=1)
        return out

    def _forward_packed(
        self, packed: Any, temperature: float, calculate_entropy: bool, entropy_grad: bool = True
    ) -> dict[str, torch.Tensor]:
        """:meth:`forward_micro_batch` over a :class:`~verl.engines.packing.PackedBatch` (no padding)."""
        if packed.labels.numel() == 0:
            zeros = packed.response_mask.new_zeros(packed.response_mask.shape, dtype=torch.float32)
            return {"log_probs": zeros, **({"entropys": zeros.clone()} if calculate_entropy else {})}
        kwargs = packed_forward_kwargs(packed)
        if self._fused:
            log_probs, entropy = self.model(
                **kwargs, select=packed.logit_index, labels=packed.labels, temperature=temperature
            )
        else:
            if self._logits_to_keep:
                # Only the positions that score a response token go through the LM head (a 49k-vocabulary
                # head costs about as much as the rest of a small model).
                logits = self.model(**kwargs, logits_to_keep=packed.logit_index).logits[0]
            else:
                logits = self.model(**kwargs).logits[0, packed.logit_index]
            log_probs, entropy = self._stats_from_logits(
                logits, packed.labels, temperature, calculate_entropy, entropy_grad
            )
        out = {"log_probs": packed.unpack(log_probs)}
        if calculate_entropy:
            out["entropys"] = packed.unpack(entropy if entropy_grad else entropy.detach())
        return out

    def _stats_from_logits(
        self, logits: torch.Tensor, labels: torch.Tensor, temperature: float, calculate_entropy: bool, grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(log_probs, entropy or None)`` of ``labels`` ``(...)`` under ``logits`` ``(..., vocab)``, float32."""
        logits = logits.float() / temperature
        log_probs = torch.gather(torch.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)
        if not calculate_entropy:
            return log_probs, None
        if grad:
            return log_probs, self._entropy_fn(logits)
        with torch.no_grad():  # a metric only: no graph (its softmax would be kept for backward)
            return log_probs, self._entropy_fn(logits.detach())
