"""verl: reinforcement-learning post-training for LLMs in the HybridFlow design.

``import verl`` is deliberately cheap and side-effect free: it imports no plugin, no
ray, no transformers and not even torch, sets no environment variable and patches
nothing. Public names are resolved lazily on first attribute access (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> (module, attribute); resolved on first access so `import verl` stays light.
_LAZY = {
    "DataProto": ("verl.protocol", "DataProto"),
    "DataProtoItem": ("verl.protocol", "DataProtoItem"),
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from verl.protocol import DataProto, DataProtoItem  # noqa: F401


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'verl' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
