"""Host offload of a training engine's weights and optimizer state between phases (hybrid engine).

While the rollout generates, the trainer's weights (``param_offload``) and optimizer state
(``optimizer_offload``) can move to host memory to make room for the KV cache; they come back before the
next forward. verl's FSDP engines do the same (``offload_fsdp_model_to_cpu`` / ``offload_fsdp_optimizer``,
``verl/utils/fsdp_utils.py``). ``Module.to`` moves FSDP2 shards too, so sharded engines inherit this. On the CPU
nothing moves.
"""

from __future__ import annotations

import torch


class HostOffload:
    """Mixin of training engines with ``model``, ``optimizer``, ``device``, ``param_offload``, ``optimizer_offload``
    and ``offloaded`` attributes."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    device: torch.device
    param_offload: bool
    optimizer_offload: bool
    offloaded: bool
    _params_offloaded: bool = False  # what the last offload moved: keep_params may have kept the weights

    def offload(self, *, keep_params: bool = False) -> dict[str, int]:
        """Move what the options say to host memory: weights (``param_offload``), optimizer state
        (``optimizer_offload``); returns ``{"params_bytes", "optimizer_bytes"}`` moved. No-op on CPU.

        Args:
            keep_params: leave the weights on the device even with ``param_offload`` (a rollout generates
                from this very module).
        """
        moved = {"params_bytes": 0, "optimizer_bytes": 0}
        if self.device.type == "cpu" or self.offloaded:
            return moved
        params = self.param_offload and not keep_params
        if params:
            moved["params_bytes"] = _module_bytes(self.model)
            self.model.to("cpu")
        if self.optimizer_offload:
            moved["optimizer_bytes"] = self._move_optimizer_state(torch.device("cpu"))
        self._params_offloaded = params
        self.offloaded = bool(params or self.optimizer_offload)
        device_module = getattr(torch, self.device.type, None)
        if self.offloaded and device_module is not None and hasattr(device_module, "empty_cache"):
            device_module.empty_cache()
        return moved

    def onload(self) -> dict[str, int]:
        """Undo :meth:`offload` (no-op when nothing is offloaded); returns the bytes moved back."""
        moved = {"params_bytes": 0, "optimizer_bytes": 0}
        if not self.offloaded:
            return moved
        if self._params_offloaded:
            self.model.to(self.device)
            moved["params_bytes"] = _module_bytes(self.model)
        if self.optimizer_offload:
            moved["optimizer_bytes"] = self._move_optimizer_state(self.device)
        self.offloaded = False
        return moved

    def _move_optimizer_state(self, device: torch.device) -> int:
        if self.optimizer is None:
            return 0
        moved = 0
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
                    moved += value.numel() * value.element_size()
        return moved


def _module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (local shards for DTensors)."""
    from verl.engines.reference.tensor_parallel import local_tensor

    tensors = [*module.parameters(), *module.buffers()]
    return sum(local_tensor(t).numel() * t.element_size() for t in tensors)
