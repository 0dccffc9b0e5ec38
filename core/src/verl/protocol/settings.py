"""Process-wide DataProto switches (follows ``DataProtoConfig`` in verl/protocol.py).

Auto padding lets ``DataProto.chunk`` accept a length that ``chunks`` does not divide. It is on when
any of these holds: ``meta_info["_verl_auto_padding"]`` is true on the DataProto, ``DataProtoConfig.auto_padding``
was set to ``True``, or the environment variable ``VERL_AUTO_PADDING`` is ``1`` / ``true`` (any case).
"""

from __future__ import annotations

import os

from verl.protocol.errors import DataProtoTypeError

__all__ = ["AUTO_PADDING_KEY", "DataProtoConfig"]

#: meta_info key that enables auto padding for one DataProto (same name as verl).
AUTO_PADDING_KEY = "_verl_auto_padding"


class _DataProtoConfigMeta(type):
    _config: dict[str, bool] = {}  # class-level on purpose: one switch board per process

    auto_padding_key = AUTO_PADDING_KEY

    @property
    def auto_padding(cls) -> bool:
        by_env = os.getenv("VERL_AUTO_PADDING", "FALSE").upper() in ("TRUE", "1")
        return by_env or cls._config.get(AUTO_PADDING_KEY, False)

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise DataProtoTypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._config[AUTO_PADDING_KEY] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Global switches; ``DataProtoConfig.auto_padding = True`` enables auto padding for every DataProto."""
