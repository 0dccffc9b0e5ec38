"""Exceptions raised by :mod:`verl.protocol`.

verl's ``verl/protocol.py`` signals most misuse with bare ``assert``; here every check raises a
subclass of :class:`DataProtoError` (itself a :class:`ValueError`), so callers can catch all protocol
errors at once while ``except KeyError`` / ``except TypeError`` / ``except IndexError`` keep working.

Where verl raises ``AssertionError`` and verl code (or its tests) catches exactly that, the error here
is also an :class:`AssertionError`: :class:`DataProtoConflictError` (union / concat values that must
agree but differ) and :class:`DataProtoSizeError` (a row count that must divide or match does not).
Unlike a bare ``assert`` they are raised under ``python -O`` too.
"""

from __future__ import annotations

__all__ = [
    "DataProtoConflictError",
    "DataProtoError",
    "DataProtoIndexError",
    "DataProtoKeyError",
    "DataProtoSizeError",
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


class DataProtoConflictError(DataProtoError, AssertionError):
    """Two DataProtos (or dicts) being merged disagree: a shared key holds different values, or the sides
    have different row counts or key sets.

    Raised by ``union_tensor_dict``, ``union_numpy_dict``, ``union_two_dict``, ``DataProto.union`` and
    ``DataProto.concat``, where verl/protocol.py asserts; ``except AssertionError`` still catches it.
    """


class DataProtoSizeError(DataProtoError, AssertionError):
    """A row count does not divide as required (``chunk`` without auto padding, ``make_iterator``,
    ``fold_batch_dim``) or leading dims disagree; verl/protocol.py asserts there.
    """
