"""``reward_model.reward_manager`` (``naive`` | ``dapo``) and the manager's share of ``reward_model.reward_kwargs``.

In verl, ``reward_model.reward_kwargs`` are the reward manager's constructor kwargs
(``load_reward_manager(config, tokenizer, **reward_kwargs)``, ``verl/trainer/ppo/reward.py``): the ``dapo``
manager (``verl/workers/reward_manager/dapo.py``) takes ``max_resp_len`` and ``overlong_buffer_cfg {enable,
len, penalty_factor, log}``. Here the keys a manager takes are split off for it; the rest are keywords for
the scorer (an extension of verl: ``{method: flexible}`` for the built-in GSM8K scorer, or any keyword of a
``custom_reward_function``).

DAPO overlong penalty (DAPO paper, arXiv:2503.14476, "soft overlong punishment"; verl's formula): with
``expected = max_resp_len - len`` and ``L`` the valid response length,
``penalty = min(-(L - expected) / len * penalty_factor, 0)``, added to the score; with ``log`` the per-sample
``overlong_reward`` and ``overlong`` (penalty < 0) go to the reward extra info.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

# The managers built; verl's others are refused in config validation with the alternative.
REWARD_MANAGERS = ("naive", "dapo")
_MANAGER_KWARGS = {"naive": (), "dapo": ("max_resp_len", "overlong_buffer_cfg")}
_KEY = "reward_model.reward_kwargs"


@attrs.frozen(kw_only=True)
class OverlongBuffer:
    """The dapo manager's soft overlong penalty (verl ``overlong_buffer_cfg`` + ``max_resp_len``).

    Attributes:
        len: buffer length in tokens before ``max_resp_len`` where the penalty ramps from 0 to ``-penalty_factor``.
        penalty_factor: the penalty at ``L = max_resp_len``.
        log: report ``overlong_reward`` / ``overlong`` per sample.
        max_resp_len: the response length the buffer ends at (tokens).
    """

    len: int
    penalty_factor: float = 1.0
    log: bool = False
    max_resp_len: int

    def penalty(self, length: int) -> float:
        """``min(-(length - (max_resp_len - len)) / len * penalty_factor, 0)`` for ``length`` valid tokens."""
        exceed = int(length) - (self.max_resp_len - self.len)
        return min(-exceed / self.len * self.penalty_factor, 0.0)


def split_reward_kwargs(manager: str, reward_kwargs: Mapping[str, Any] | None) -> tuple[OverlongBuffer | None, dict]:
    """``(the dapo penalty or None, the scorer's keywords)`` of ``reward_model.reward_kwargs`` for ``manager``.

    Raises:
        ValueError: an unknown manager name; for ``dapo``, an enabled buffer without ``max_resp_len``,
            a ``len`` <= 0 or above ``max_resp_len``, or an ``overlong_buffer_cfg`` that is not a mapping
            (verl asserts the same three conditions).
    """
    if manager not in _MANAGER_KWARGS:
        raise ValueError(
            f"reward_model.reward_manager={manager!r} is not built here; use one of {list(REWARD_MANAGERS)}"
        )
    kwargs = dict(reward_kwargs or {})
    own = {k: kwargs.pop(k) for k in _MANAGER_KWARGS[manager] if k in kwargs}
    cfg = own.get("overlong_buffer_cfg")
    if cfg is None:
        return None, kwargs
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{_KEY}.overlong_buffer_cfg must be a mapping {{enable, len, penalty_factor, log}}")
    unknown = sorted(set(cfg) - {"enable", "len", "penalty_factor", "log"})
    if unknown:
        raise ValueError(f"{_KEY}.overlong_buffer_cfg has unknown keys {unknown}; use enable, len, penalty_factor, log")
    if not cfg.get("enable", False):
        return None, kwargs
    max_len, length = own.get("max_resp_len"), cfg.get("len", 0)
    if max_len is None:
        raise ValueError(
            f"{_KEY}.max_resp_len must be set when overlong_buffer_cfg.enable is true (verl: "
            "+reward_model.reward_kwargs.max_resp_len=<data.max_response_length>)"
        )
    if not 0 < int(length) <= int(max_len):
        raise ValueError(
            f"{_KEY}.overlong_buffer_cfg.len={length} must be > 0 and <= max_resp_len={max_len}; to switch the "
            "penalty off set overlong_buffer_cfg.enable=false"
        )
    buffer = OverlongBuffer(
        len=int(length),
        penalty_factor=float(cfg.get("penalty_factor", 1.0)),
        log=bool(cfg.get("log", False)),
        max_resp_len=int(max_len),
    )
    return buffer, kwargs
