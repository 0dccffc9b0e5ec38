"""The LoRA side of the training engines' weights: merged sync, adapter names, the peft adapter folder.

A mixin of :class:`verl.engines.reference.training.ReferenceTrainingEngine` (and so of verl-fsdp's engine, which
overrides the two hooks :meth:`LoraWeights._full_tensor` and :meth:`LoraWeights._writes_files`). It expects
``self.model`` (the adapted HF module), ``self.peft_model`` (None when LoRA is off), ``self._lora_modules`` and
``self.onload()``. See :mod:`verl.engines.lora` for the maths.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch

from verl.engines.lora import ADAPTER_DIR


class LoraWeights:
    """Weight views of an engine that may train LoRA adapters (``model.lora_rank > 0``)."""

    peft_model: Any = None
    #: Sub-folder of a HF export (``save_hf``) and of a checkpoint holding the peft adapter.
    adapter_dir: ClassVar[str] = ADAPTER_DIR
    _lora_modules: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance when LoRA is on

    @property
    def lora(self) -> bool:
        """Whether this engine trains LoRA adapters (``model.lora_rank > 0``)."""
        return self.peft_model is not None

    def _full_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Hook: the whole tensor of a (possibly sharded) parameter; identity here, FSDP gathers (collective)."""
        return tensor

    def _sync_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What the rollout gets: the state dict, or with LoRA the merged base-model weights (live tensors untouched)."""
        items = self.model.state_dict().items()
        if not self.lora:
            return iter(items)
        return self.merged(items, self._full_tensor)

    def merged(self, items: Iterable[tuple[str, torch.Tensor]], full: Any = None) -> Iterator[tuple[str, torch.Tensor]]:
        """:func:`verl.engines.lora.merged_weights` of this engine's adapted layers over ``items`` (state-dict
        pairs of the adapted module, e.g. a gathered full state dict); ``full`` gathers a shard (default: none)."""
        from verl.engines.lora import merged_weights

        return merged_weights(items, self._lora_modules, full or (lambda t: t))

    def _sync_named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """``(name the rollout gets, source tensor)`` without computing anything: with LoRA, base names and the
        base weights (the merged weight has their shape and dtype), adapter keys dropped."""
        from verl.engines.lora import base_name, is_adapter_key

        items = list(self.model.state_dict().items())
        if not self.lora:
            return items
        return [(base_name(n), t) for n, t in items if not is_adapter_key(n)]

    def _sync_manifest(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, global shape)`` of :meth:`_sync_items`, without computing anything."""
        return [(n, tuple(t.shape)) for n, t in self._sync_named_tensors()]

    def adapter_names(self) -> list[str]:
        """Names (state-dict keys) of the trainable adapter parameters; empty when LoRA is off."""
        return [n for n, p in self.model.named_parameters() if p.requires_grad] if self.lora else []

    def _check_adapter_keys(self, model_state: dict[str, Any]) -> None:
        """Raise ValueError unless ``model_state`` holds exactly this engine's adapter parameters."""
        expected, got = set(self.adapter_names()), set(model_state)
        if got != expected:
            raise ValueError(
                f"LoRA checkpoint adapter keys differ from this engine's: missing {sorted(expected - got)[:3]}, "
                f"unexpected {sorted(got - expected)[:3]} (same lora_rank / target_modules as when it was saved?)"
            )

    def save_adapter(self, folder: Any) -> Any:
        """Write the LoRA adapter as a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``).

        Collective for sharded engines (the adapter is gathered); only :meth:`_writes_files` ranks write.

        Raises:
            RuntimeError: LoRA is off.
        """
        from verl.engines.lora import adapter_state, is_adapter_key, save_adapter

        if not self.lora:
            raise RuntimeError("save_adapter: this engine has no LoRA adapter (model.lora_rank=0)")
        self.onload()
        items = [(n, self._full_tensor(t).detach()) for n, t in self.model.state_dict().items() if is_adapter_key(n)]
        if self._writes_files():
            save_adapter(folder, adapter_state(items, self.peft_model), self.peft_model)
        return folder

    def lora_adapter(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The live adapter for a rollout that serves LoRA adapters (vLLM ``LoRARequest``; verl's non-merged sync).

        Collective for sharded engines (every rank gathers the whole adapter, in state-dict order).

        Returns:
            ``(tensors, config)``: ``tensors`` in peft's file format (``base_model.model.<...>.lora_A.weight``
            ``(r, in)`` and ``lora_B.weight`` ``(out, r)``), whole, detached, on the CPU, in the parameters' dtype;
            ``config``: the adapter's peft ``LoraConfig`` as a JSON-able dict (``adapter_config.json``'s content).

        Raises:
            RuntimeError: LoRA is off.
        """
        from verl.engines.lora import ADAPTER_NAME, adapter_state, is_adapter_key

        if not self.lora:
            raise RuntimeError("lora_adapter: this engine has no LoRA adapter (model.lora_rank=0)")
        self.onload()
        items = [
            (n, self._full_tensor(t).detach().cpu()) for n, t in self.model.state_dict().items() if is_adapter_key(n)
        ]
        config = self.peft_model.peft_config[ADAPTER_NAME].to_dict()
        # peft keeps resolved target names as a set; JSON (and vLLM's reader) want a list.
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
        return adapter_state(items, self.peft_model), config

    def _writes_files(self) -> bool:
        """Hook: whether this rank writes shared files (rank 0 of a sharded engine)."""
        return True
