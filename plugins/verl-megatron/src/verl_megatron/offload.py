"""Host offload of a Megatron model on accelerators (``param_offload``, ``grad_offload``, ``optimizer_offload``).

As verl's ``offload_megatron_model_to_cpu`` / ``offload_megatron_optimizer``: the DDP parameter buffers keep their
shape but their device storage is released after a host copy (the parameters are views into them), the gradient
buffers go through DDP's own ``offload_grad_buffers`` / ``restore_grad_buffers``, and the optimizer state tensors
move to host memory. Never run on the cpu device (nothing would move). Untested here: no accelerator on the
development machine (``scripts/check_cuda.sh`` runs it).
"""

from __future__ import annotations

from typing import Any

import torch


def _buffers(module: Any) -> list[Any]:
    return list(getattr(module, "buffers", []) or []) + list(getattr(module, "expert_parallel_buffers", []) or [])


def _optimizer_states(optimizer: Any) -> list[dict[str, Any]]:
    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return [state for opt in inner for state in getattr(getattr(opt, "optimizer", None), "state", {}).values()]


def offload(mm: Any, *, params: bool, grads: bool, optimizer: bool) -> dict[str, int]:
    """Move what is asked to host memory; returns the bytes moved per kind."""
    moved = {"params_bytes": 0, "grads_bytes": 0, "optimizer_bytes": 0}
    module = mm.module
    if params:
        buffers = _buffers(module)
        if buffers:
            for buf in buffers:
                data = buf.param_data
                buf._verl_host = data.detach().to("cpu", non_blocking=False)
                moved["params_bytes"] += data.numel() * data.element_size()
                data.untyped_storage().resize_(0)
        else:  # forward-only module without DDP: the parameters themselves
            for p in mm.base.parameters():
                moved["params_bytes"] += p.numel() * p.element_size()
                p.data = p.data.to("cpu")
    if grads and hasattr(module, "offload_grad_buffers"):
        moved["grads_bytes"] = sum(b.grad_data.numel() * b.grad_data.element_size() for b in _buffers(module))
        module.offload_grad_buffers(synchronize=True, empty_cache=False)
    if optimizer and mm.optimizer is not None:
        for state in _optimizer_states(mm.optimizer):
            for key, value in state.items():
                if torch.is_tensor(value) and value.device.type != "cpu":
                    moved["optimizer_bytes"] += value.numel() * value.element_size()
                    state[key] = value.to("cpu")
    if any(moved.values()) and mm.device.type == "cuda":
        torch.cuda.empty_cache()
    return moved


def onload(mm: Any, *, params: bool, grads: bool, optimizer: bool) -> dict[str, int]:
    """Bring back what :func:`offload` moved (same flags)."""
    back = {"params_bytes": 0, "grads_bytes": 0, "optimizer_bytes": 0}
    module = mm.module
    if params:
        buffers = _buffers(module)
        if buffers:
            for buf in buffers:
                host = buf._verl_host
                data = buf.param_data
                data.untyped_storage().resize_(host.numel() * host.element_size())
                data.copy_(host.to(data.device))
                back["params_bytes"] += host.numel() * host.element_size()
                buf._verl_host = None
        else:
            for p in mm.base.parameters():
                p.data = p.data.to(mm.device)
                back["params_bytes"] += p.numel() * p.element_size()
    if grads and hasattr(module, "restore_grad_buffers"):
        module.restore_grad_buffers(synchronize=True)
    if optimizer and mm.optimizer is not None:
        for state in _optimizer_states(mm.optimizer):
            for key, value in state.items():
                if torch.is_tensor(value) and value.device.type == "cpu" and key != "step":
                    back["optimizer_bytes"] += value.numel() * value.element_size()
                    state[key] = value.to(mm.device)
    return back
