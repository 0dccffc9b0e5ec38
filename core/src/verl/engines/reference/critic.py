"""Reference critic engine: the value model (causal LM backbone + scalar head) trained for GAE.

``critic.strategy=reference``. Everything but the model and its forward is the reference
training engine's machinery (mini-/micro-batches, token budget, global loss normalisation,
grad clipping, AdamW + LR schedule, state dict), so a critic update is numerically what the
actor update is with the value loss in place of the policy loss.

Value model (verl ``load_valuehead_model`` in ``verl/utils/model.py``, legacy ``CriticWorker``):
``AutoModelForTokenClassification.from_pretrained(path, num_labels=1)`` with the classifier
dropout set to 0. For a causal-LM checkpoint (e.g. ``LlamaForCausalLM``) that loads the backbone
(``AutoModel`` weights under ``model.*``) and creates a fresh ``score = nn.Linear(hidden, 1)``
head, initialised by HF's ``_init_weights`` (normal(0, ``initializer_range``), bias 0) exactly as
verl's critic gets it; the LM head is dropped.

Alignment (verl ``dp_critic.py:_forward_micro_batch`` / ``no_padding_2_padding``): the value of
response token ``t`` is the head's output at input position ``prompt_len - 1 + t``, i.e. the state
*before* the token is emitted: ``values = out[:, -resp_len - 1 : -1]``.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.engines.micro_batch import restore_order, trim_padding
from verl.engines.packing import pack_batch, packed_forward_kwargs
from verl.engines.reference.training import ReferenceTrainingEngine


def load_value_model(
    path: Any, dtype: torch.dtype, *, trust_remote_code: bool = False, override_config: Any = None
) -> torch.nn.Module:
    """Load ``path`` as a value model: ``AutoModelForTokenClassification`` with ``num_labels=1``.

    Args:
        path: HF folder or hub id (a causal-LM checkpoint works: its backbone is loaded, the head is new).
        dtype: parameter dtype.
        trust_remote_code: forwarded to ``from_pretrained`` (``critic.model.trust_remote_code``).
        override_config: HF config values set before the weights load (``critic.model.override_config``).

    Returns:
        the module; ``module(input_ids, attention_mask, position_ids).logits`` is ``(bs, seq, 1)``.

    Raises:
        ValueError: the checkpoint cannot be loaded as a token-classification model (the message names
            the path and the architecture support needed), or an ``override_config`` key the config lacks.
    """
    from transformers import AutoModelForTokenClassification

    from verl.models.hf_config import load_hf_config

    try:
        config = load_hf_config(
            path,
            trust_remote_code=trust_remote_code,
            override_config=override_config,
            field="critic.model.override_config",
            num_labels=1,
        )
        config.classifier_dropout = 0.0  # verl: no dropout in the value head (deterministic values)
        return AutoModelForTokenClassification.from_pretrained(
            str(path), config=config, dtype=dtype, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(
            f"cannot load critic.model.path={str(path)!r} as a value model (AutoModelForTokenClassification, "
            f"num_labels=1; the architecture needs a *ForTokenClassification class in transformers): {exc}"
        ) from exc


class ReferenceCriticEngine(ReferenceTrainingEngine):
    """A :class:`ReferenceTrainingEngine` over a value model: ``compute_values`` and value-loss training.

    Args: as :class:`ReferenceTrainingEngine`; ``model`` is a HF folder (loaded with
    :func:`load_value_model`) or a built module whose output ``.logits`` is ``(bs, seq, 1)``.

    ``train_batch(data, loss_fn)`` passes ``outputs = {"values": (bs, resp_len)}`` (with grad) to
    ``loss_fn`` and reports ``critic/grad_norm``, ``critic/lr``, ``critic/skipped_steps``.
    """

    metric_prefix = "critic"
    _trust_remote_code = False

    def __init__(self, *args: Any, trust_remote_code: bool | None = None, **kwargs: Any) -> None:
        if trust_remote_code is not None:  # None keeps what a subclass set before calling up
            self._trust_remote_code = trust_remote_code
        super().__init__(*args, **kwargs)

    def _load(self, model: Any, dtype: torch.dtype) -> torch.nn.Module:
        if isinstance(model, torch.nn.Module):
            return model.to(dtype)
        trust = self._trust_remote_code or self.settings.trust_remote_code
        return load_value_model(model, dtype, trust_remote_code=trust, override_config=self.settings.override_config)

    def forward_micro_batch(
        self, batch: Any, temperature: float = 1.0, *, calculate_entropy: bool = False, entropy_grad: bool = True
    ) -> dict[str, torch.Tensor]:
        """Values of one micro-batch's response tokens, with grad if enabled.

        Args:
            batch: mapping with ``input_ids``, ``attention_mask``, ``position_ids`` ``(bs, prompt_len + resp_len)``
                and ``responses`` ``(bs, resp_len)``.
            temperature, calculate_entropy, entropy_grad: ignored (the engine interface of the actor).

        Returns:
            ``{"values": (bs, resp_len) float32}``: value of response token ``t`` = head output at input
            position ``prompt_len - 1 + t``; 0 where the response is padding.
        """
        resp_len = batch["responses"].shape[1]
        bs = batch["responses"].shape[0]
        if self._packed:
            packed = pack_batch(
                batch["input_ids"].to(self.device),
                batch["attention_mask"].to(self.device),
                batch["position_ids"].to(self.device),
                batch["responses"].to(self.device),
            )
            if packed is not None:
                return {"values": self._values_packed(packed)}
        input_ids, attention_mask, position_ids, _, kept = trim_padding(
            batch["input_ids"].to(self.device),
            batch["attention_mask"].to(self.device),
            batch["position_ids"].to(self.device),
            resp_len,
        )
        pad = torch.zeros(bs, resp_len - kept, dtype=torch.float32, device=self.device)
        if kept == 0:  # only empty responses: nothing to value
            return {"values": pad}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        seq = input_ids.shape[1]
        values = out[:, -kept - 1 : -1, 0].float()
        valid = attention_mask[:, seq - kept :].bool()
        return {"values": torch.cat([torch.where(valid, values, 0.0), pad], dim=1)}

    def _values_packed(self, packed: Any) -> torch.Tensor:
        """Values over a :class:`~verl.engines.packing.PackedBatch`: the head at the positions that score the
        response tokens (``logit_index``: input position ``prompt_len - 1 + t``), scattered to ``(bs, resp_len)``."""
        if packed.labels.numel() == 0:
            return packed.response_mask.new_zeros(packed.response_mask.shape, dtype=torch.float32)
        out = self.model(**packed_forward_kwargs(packed)).logits[0, packed.logit_index, 0].float()
        return packed.unpack(out)

    @torch.no_grad()
    def compute_values(self, data: Any) -> Any:
        """Values of ``data``'s responses under the current weights (no grad).

        Args:
            data: DataProto with ``input_ids, attention_mask, position_ids, responses``.

        Returns:
            DataProto with ``values`` ``(bs, resp_len)`` float32 in the input's row order (0 on padding).
            Micro-batches follow the engine's ``infer_*`` settings.
        """
        from verl.protocol import DataProto

        s = self.settings
        plan = self._plan(
            data,
            use_dynamic=s.infer_use_dynamic_bsz,
            micro=s.infer_micro_batch_size,
            max_tokens=s.infer_max_token_len,
            packed=self._packed,
        )
        outs = [self.forward_micro_batch(data.batch[torch.tensor(rows)], 1.0)["values"].cpu() for rows in plan]
        return DataProto.from_dict(tensors={"values": restore_order(plan, outs)})
