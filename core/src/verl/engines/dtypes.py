"""Dtype names accepted in engine configs (``rollout.dtype``, ``engine_kwargs.reference.dtype``)."""

from __future__ import annotations

from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_dtype(value: Any, device: torch.device, *, field: str = "dtype") -> torch.dtype:
    """Map a dtype name to a torch dtype; ``None``/``"auto"`` -> float32 on CPU, bfloat16 elsewhere.

    float32 is the CPU default because bf16 matmuls are several times slower on CPUs without
    AVX-512/AMX (DESIGN §10).

    Raises:
        ValueError: unknown name; the message names ``field`` and lists the accepted names.
    """
    if isinstance(value, torch.dtype):
        return value
    if value is None or str(value).lower() == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    try:
        return DTYPES[str(value).lower()]
    except KeyError:
        raise ValueError(f"{field}={value!r} is not one of {sorted(DTYPES)} or 'auto'") from None
