"""The LoRA side of the training engines' weights: merged sync, adapter names, the peft adapter folder.

A mixin of :class:`verl.engines.reference.training.ReferenceTrainingEngine` (and so of verl-fsdp's engine, which
overrides the two hooks :meth:`LoraWeights._full_tensor` and :meth:`LoraWeights._writes_files`). It expects
``self.model`` (the adapted HF module), ``self.peft_model`` (None when LoRA is off), ``self._lora_modules`` and
``self.onload()``. See :mod:`verl.engines.lora` for the maths.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class LoraWeights:
    """Weight views of an engine that may train LoRA adapters (``model.lora_rank > 0``)."""

    peft_model: Any = None
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
        from verl.engines.lora import merged_weights

        return merged_weights(items, self._lora_modules, self._full_tensor)

    def _sync_manifest(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, global shape)`` of :meth:`_sync_items`, without computing anything."""
        from verl.engines.lora import merged_manifest

        shapes = [(n, tuple(t.shape)) for n, t in self.model.state_dict().items()]
        return merged_manifest(shapes, self._lora_modules) if self.lora else shapes

    def _adapter_names(self) -> list[str]:
        return [n for n, p in self.model.named_parameters() if p.requires_grad]

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

    def _writes_files(self) -> bool:
        """Hook: whether this rank writes shared files (rank 0 of a sharded engine)."""
        return True
