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

import difflib
from collections.abc import Mapping
from typing import Any

import attrs

from verl.rewards.errors import RewardConfigError

# The managers built, and the reason and alternative for verl's others. This module is the one place
# the rules live: config validation (verl.config.validate_support) reports the same errors at load time.
REWARD_MANAGERS = ("naive", "dapo")
REFUSED_MANAGERS = {
    "batch": (
        "verl's batch manager calls one compute_score(data_sources, solution_strs, ground_truths, extra_infos) "
        "per batch, which is not built; write a per-sample custom_reward_function (it runs in parallel with "
        "reward_model.num_workers)"
    ),
    "prime": (
        "verl's prime manager is naive in a process pool with a timeout: use reward_manager=naive with "
        "reward_model.isolation=process and reward_model.timeout_s=300"
    ),
}
_MANAGER_KWARGS = {"naive": (), "dapo": ("max_resp_len", "overlong_buffer_cfg")}
_BUFFER_KEYS = ("enable", "len", "penalty_factor", "log")
_KEY = "reward_model.reward_kwargs"


class RewardKwargsError(RewardConfigError):
    """``reward_model.reward_manager`` or one of its ``reward_kwargs`` is wrong.

    Attributes:
        key: the full dotted key, e.g. ``reward_model.reward_kwargs.overlong_buffer_cfg.len``.
        detail: what is wrong and the fix; starts with ``=`` when it quotes the value.
    """

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(f"{key}{detail}" if detail.startswith("=") else f"{key} {detail}")

    def __reduce__(self):
        return (type(self), (self.key, self.detail))


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

    ``max_resp_len`` and ``overlong_buffer_cfg.len`` must be ints (not bools), ``penalty_factor`` a number,
    ``enable`` and ``log`` bools. With ``enable`` true, verl's three assertions hold here too.

    Raises:
        RewardKwargsError (a ValueError) naming the key: an unknown or unbuilt manager (with the
            alternative); a dapo key under another manager; a value of the wrong type; an
            ``overlong_buffer_cfg`` that is not a mapping or has unknown keys; for an enabled buffer, no
            ``max_resp_len``, or a ``len`` <= 0 or above ``max_resp_len``.
    """
    if manager not in REWARD_MANAGERS:
        reason = REFUSED_MANAGERS.get(manager, "no such reward manager")
        close = difflib.get_close_matches(str(manager), REWARD_MANAGERS, n=1)
        hint = f". Did you mean {close[0]!r}?" if close else ""
        raise RewardKwargsError(
            "reward_model.reward_manager", f"={manager!r}: {reason}; built: {list(REWARD_MANAGERS)}{hint}"
        )
    kwargs = dict(reward_kwargs or {})
    foreign = [k for k in _MANAGER_KWARGS["dapo"] if k in kwargs and k not in _MANAGER_KWARGS[manager]]
    if foreign:
        raise RewardKwargsError(
            f"{_KEY}.{foreign[0]}",
            "is a key of the dapo reward manager (overlong penalty); set reward_model.reward_manager=dapo",
        )
    own = {k: kwargs.pop(k) for k in _MANAGER_KWARGS[manager] if k in kwargs}
    max_len = own.get("max_resp_len")
    if max_len is not None:
        _check_int(f"{_KEY}.max_resp_len", max_len, "the response length in tokens (data.max_response_length)")
    cfg = own.get("overlong_buffer_cfg")
    if cfg is None:
        return None, kwargs
    key = f"{_KEY}.overlong_buffer_cfg"
    if not isinstance(cfg, Mapping):
        raise RewardKwargsError(key, f"={cfg!r} must be a mapping {{enable, len, penalty_factor, log}}")
    unknown = sorted(set(cfg) - set(_BUFFER_KEYS))
    if unknown:
        raise RewardKwargsError(key, f"has unknown keys {unknown}; use enable, len, penalty_factor, log")
    for flag in ("enable", "log"):
        if flag in cfg and not isinstance(cfg[flag], bool):
            raise RewardKwargsError(f"{key}.{flag}", f"={cfg[flag]!r} must be true or false")
    factor = cfg.get("penalty_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise RewardKwargsError(f"{key}.penalty_factor", f"={factor!r} must be a number (the penalty at max_resp_len)")
    length = cfg.get("len", 0)
    _check_int(f"{key}.len", length, "the buffer length in tokens")
    if not cfg.get("enable", False):
        return None, kwargs
    if max_len is None:
        raise RewardKwargsError(
            f"{_KEY}.max_resp_len",
            "must be set when overlong_buffer_cfg.enable is true (verl: "
            "+reward_model.reward_kwargs.max_resp_len=<data.max_response_length>)",
        )
    if not 0 < length <= max_len:
        raise RewardKwargsError(
            f"{key}.len",
            f"={length} must be > 0 and <= max_resp_len={max_len}; to switch the penalty off set "
            "overlong_buffer_cfg.enable=false",
        )
    buffer = OverlongBuffer(
        len=length, penalty_factor=float(factor), log=bool(cfg.get("log", False)), max_resp_len=max_len
    )
    return buffer, kwargs


def _check_int(key: str, value: Any, what: str) -> None:
    # bool is an int subclass; true/false here is a typo, not a length.
    if isinstance(value, bool) or not isinstance(value, int):
        raise RewardKwargsError(key, f"={value!r} must be an int: {what}")
