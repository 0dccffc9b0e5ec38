"""LoRA served as an adapter by the ``vllm`` rollout (verl's ``model.lora.merge=false`` path, anatomy §6.3).

verl starts vLLM with ``enable_lora=True, max_loras=1, max_lora_rank=<rank rounded up to vLLM's choices>`` and, after
one base sync, sends only the adapter at every step (its ``TensorLoRARequest`` patch of vLLM's loader); generation
requests carry the ``LoRARequest``. Here the base is the model folder vLLM loaded at start-up (the trainer's base
weights are frozen, so it never changes), and the adapter goes through vLLM's public LoRA API without patches:
each sync writes it as a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``, a few MB for a
135M model at rank 16) and reloads adapter id 1 in place (``LLMEngine.add_lora`` with
``LoRARequest(load_inplace=True)``); generation requests carry the same id without ``load_inplace`` so vLLM
does not reload it per step. The prefix cache is reset after each load: its block hashes include the adapter id,
which stays the same while the weights change.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

#: vLLM's ``LoRAConfig.max_lora_rank`` choices (``vllm/config/lora.py: MaxLoRARanks``, vLLM 0.32).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_ID = 1
ADAPTER_NAME = "verl_actor"
#: Modules vLLM cannot serve an adapter on (its LoRA layers cover the decoder's linear layers).
_UNSERVED = ("lm_head", "embed_tokens")


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest of vLLM's ``max_lora_rank`` choices that holds ``rank`` (verl's ``get_vllm_max_lora_rank``).

    Raises:
        ValueError: ``rank`` above vLLM's largest choice (512).
    """
    for choice in MAX_LORA_RANKS:
        if rank <= choice:
            return choice
    raise ValueError(
        f"actor_rollout_ref.model.lora_rank={rank}: vLLM serves adapters up to rank {MAX_LORA_RANKS[-1]}; "
        "lower it or set actor_rollout_ref.model.lora.merge=true (merged weights)"
    )


def lora_engine_arguments(rank: int, lora_section: Any = None) -> dict[str, Any]:
    """``vllm.LLM`` arguments of an engine that serves one adapter of rank ``rank``: ``enable_lora``,
    ``max_loras=1``, ``max_lora_rank``, and ``fully_sharded_loras`` when ``model.lora.fully_sharded_loras`` is set
    (as verl's vLLM server)."""
    args: dict[str, Any] = {"enable_lora": True, "max_loras": 1, "max_lora_rank": vllm_max_lora_rank(int(rank))}
    if bool((lora_section or {}).get("fully_sharded_loras", False)):
        args["fully_sharded_loras"] = True
    return args


def _scratch_dir() -> Path:
    """A private folder for the adapter files: in ``/dev/shm`` (memory) when it is writable, else the temp dir."""
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="verl-vllm-lora-", dir=base))


class AdapterSlot:
    """The one adapter an engine serves: written at every sync, reloaded in place, attached to every request.

    Args:
        llm: the engine's ``vllm.LLM`` (built with :func:`lora_engine_arguments`).
        max_rank: the engine's ``max_lora_rank``.
    """

    def __init__(self, llm: Any, max_rank: int) -> None:
        self.llm = llm
        self.max_rank = int(max_rank)
        self.folder = _scratch_dir() / "adapter"
        self.loads = 0
        self.request: Any = None  # None until the first load: the base model (what a fresh B = 0 adapter computes)

    def load(self, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
        """Serve ``tensors`` (peft file-format names, whole tensors) with peft ``config`` from the next request on.

        Raises:
            ValueError: the adapter's rank exceeds the engine's ``max_lora_rank``, or it adapts a module vLLM
                cannot serve (``lm_head``, ``embed_tokens``); nothing is loaded.
            whatever vLLM raises loading the folder (the previous adapter stays served).
        """
        from safetensors.torch import save_file

        rank = int(config.get("r", 0))
        if rank > self.max_rank:
            raise ValueError(f"LoRA adapter rank {rank} exceeds the vllm engine's max_lora_rank={self.max_rank}")
        unserved = sorted({part for name in tensors for part in _UNSERVED if f".{part}." in name})
        if unserved:
            raise ValueError(
                f"the LoRA adapter adapts {unserved}, which vLLM cannot serve as an adapter; exclude them "
                "(actor_rollout_ref.model.exclude_modules) or set actor_rollout_ref.model.lora.merge=true"
            )
        staging = self.folder.with_name("staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(staging / "adapter_model.safetensors")
        )
        (staging / "adapter_config.json").write_text(json.dumps(config, indent=2, default=list))
        shutil.rmtree(self.folder, ignore_errors=True)
        staging.rename(self.folder)
        from vllm.lora.request import LoRARequest

        self.llm.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(self.folder), load_inplace=True))
        # Requests name the adapter without load_inplace: with it vLLM would reload the folder at every step.
        self.request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(self.folder))
        self.llm.reset_prefix_cache()
        self.loads += 1

    def close(self) -> None:
        """Remove the adapter files (the engine is being shut down)."""
        shutil.rmtree(self.folder.parent, ignore_errors=True)


class LoraServing:
    """The adapter side of :class:`~verl_vllm.engine.VLLMRolloutEngine` (a mixin over its ``_adapter`` slot,
    ``_exclusive`` server hold and sleep state)."""

    _adapter: AdapterSlot | None = None

    @property
    def serves_lora_adapters(self) -> bool:
        """Whether this engine serves a LoRA adapter (built with ``lora_rank > 0``): the sync sends the adapter."""
        return self._adapter is not None

    @property
    def lora_request(self) -> Any:
        """The ``LoRARequest`` every generation carries; None without LoRA or before the first adapter load."""
        return self._adapter.request if self._adapter is not None else None

    def load_lora_adapter(self, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
        """Serve this adapter from the next request on (:meth:`verl_vllm.lora.AdapterSlot.load`).

        ``tensors``: peft file-format names (``base_model.model.<...>.lora_A.weight`` ``(r, in)``, ``lora_B``
        ``(out, r)``), whole; ``config``: its peft ``LoraConfig`` dict.

        Raises:
            RuntimeError: built without LoRA (``lora_rank=0``), or the :meth:`server` has requests in flight.
            ValueError: rank above ``max_lora_rank``, or an adapted ``lm_head`` / ``embed_tokens``.
        """
        if self._adapter is None:
            raise RuntimeError("VLLMRolloutEngine.load_lora_adapter: the engine was built with lora_rank=0")
        with self._exclusive("load_lora_adapter"):
            if self._asleep and "weights" not in self._awake_tags:
                self.llm.wake_up(tags=["weights"])
                self._awake_tags.add("weights")
            self._adapter.load(tensors, config)
