"""Field helpers: every config key carries a one-line doc (meaning and unit) in its metadata.

``attrs.fields(SomeConfig).key.metadata["doc"]`` is what docs and ``verl config`` use to
explain a key, so the explanation lives next to the default it explains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

DOC = "doc"

# Free-form option dicts, e.g. model.override_config or engine_kwargs.vllm: keys are not in the schema.
FreeDict = dict[str, Any]
# Per-backend option dicts keyed by backend name: engine_kwargs.fsdp, engine_kwargs.vllm, ...
BackendKwargs = dict[str, dict[str, Any]]


def fld(default: Any = attrs.NOTHING, *, doc: str, factory: Callable[[], Any] | None = None) -> Any:
    """A documented config key with a default value (or a ``factory`` for mutable defaults)."""
    if factory is not None:
        return attrs.field(factory=factory, metadata={DOC: doc})
    return attrs.field(default=default, metadata={DOC: doc})


def free_dict(*, doc: str) -> Any:
    """A documented free-form dict key (default ``{}``), left out of the hash since dicts are mutable."""
    return attrs.field(factory=dict, hash=False, metadata={DOC: doc})


def section(cls: type, *, doc: str) -> Any:
    """A documented nested section whose default is ``cls()``."""
    return attrs.field(factory=cls, metadata={DOC: doc})
