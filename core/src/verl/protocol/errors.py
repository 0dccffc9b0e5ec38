"""Exceptions raised by :mod:`verl.protocol`.

verl's ``verl/protocol.py`` signals most misuse with bare ``assert``; here every check raises a
subclass of :class:`DataProtoError` (itself a :class:`ValueError`), so callers can catch all protocol
errors at once while ``except KeyError`` / ``except TypeError`` / ``except IndexError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "DataProtoError",
    "DataProtoIndexError",
    "DataProtoKeyError",
    "DataProtoTypeError",
]


class DataProtoError(ValueError):
    """Invalid DataProto content or arguments (sizes that disagree, conflicting values, bad options)."""


class DataProtoKeyError(DataProtoError, KeyError):
    """A batch / non_tensor_batch / meta_info key is missing or would be overwritten."""

    def __str__(self) -> str:
        # KeyError.__str__ repr()-quotes its argument, which garbles multi-line messages.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class DataProtoTypeError(DataProtoError, TypeError):
    """An argument or stored value has an unsupported type."""


class DataProtoIndexError(DataProtoError, IndexError):
    """A row index is out of range for the DataProto's length."""
