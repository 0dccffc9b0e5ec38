"""Requests of the ``hf`` engine's async server: their validation and the record the decode loop keeps.

:func:`parse_request` checks a request against :mod:`verl.engines.serving`'s sampling-params contract and the
engine's limits in the caller's thread, so a bad request raises ``ValueError`` from ``generate`` itself (naming
the field and the fix) and never reaches the decode thread.
"""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from verl.engines.reference.rollout_options import ROLLOUT
from verl.engines.reference.sampling import SamplingParams
from verl.engines.serving import check_sampling_params


@attrs.frozen(kw_only=True)
class RequestLimits:
    """What a request is checked against (from the engine and its rollout config).

    Attributes:
        context_limit: positions a sequence may use (``max_model_len`` or ``max_position_embeddings``; None =
            unknown); ``context_source`` names it in messages.
        max_num_batched_tokens: longest prompt a prefill takes (None = no limit).
        vocab_size: prompt ids must lie in ``[0, vocab_size)`` (None = unchecked).
        response_length: ``rollout.response_length``, the sync path's number of sampler draws per row.
        eos_token_ids: ids that end every request (empty with ``ignore_eos``).
    """

    context_limit: int | None
    context_source: str
    max_num_batched_tokens: int | None
    vocab_size: int | None
    response_length: int
    eos_token_ids: frozenset[int]


class Request:
    """One request's inputs, its progress and where its result goes.

    ``tokens`` / ``log_probs`` grow by one per decode step; ``uniforms`` ``(max_draws,)`` float32 are its
    sampler draws (empty when greedy), drawn by the server at admission; ``loop`` / ``future`` are the
    caller's event loop and the future its ``generate`` awaits; ``cancelled`` is set when that await was
    cancelled, ``resolved`` once the request was answered.
    """

    __slots__ = (
        "cancelled",
        "future",
        "log_probs",
        "loop",
        "max_draws",
        "max_tokens",
        "params",
        "prompt",
        "resolved",
        "seed",
        "stop_ids",
        "tokens",
        "uniforms",
        "want_logprobs",
    )

    def __init__(self, prompt: list[int], params: SamplingParams, max_tokens: int, max_draws: int) -> None:
        self.prompt, self.params, self.max_tokens, self.max_draws = prompt, params, max_tokens, max_draws
        self.seed: int | None = None
        self.stop_ids: frozenset[int] = frozenset()
        self.want_logprobs = False
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.cancelled = False
        self.resolved = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.future: asyncio.Future | None = None
        self.uniforms = torch.zeros(0)


def _number(params: Mapping[str, Any], key: str, default: Any, cast: type, owner: str) -> Any:
    """``params[key]`` as ``cast`` (``default`` when absent or None); ValueError naming the key otherwise."""
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}: sampling_params[{key!r}] must be a number, got {value!r}")
    if cast is int and value != int(value):
        raise ValueError(f"{owner}: sampling_params[{key!r}] must be an integer, got {value!r}")
    return cast(value)


def parse_request(
    prompt_ids: Sequence[int], params: Mapping[str, Any], limits: RequestLimits, *, owner: str
) -> Request:
    """A :class:`Request` for ``prompt_ids`` under ``params`` (:data:`verl.engines.serving.SAMPLING_KEYS`).

    ``temperature`` 0 is greedy; ``max_tokens`` is capped to the context left after the prompt; ``max_draws``
    is ``max(max_tokens, response_length)`` for a sampled request (the sync path draws ``response_length``
    uniforms per row; a CPU generator's first draws do not depend on how many are drawn), 0 when greedy;
    ``stop_ids`` are the EOS ids plus ``stop_token_ids``.

    Raises:
        ValueError (message starts with ``owner``): an unknown key or ``max_tokens < 1``, an empty prompt, ids
            outside the vocabulary, a prompt that leaves no room in the context or is longer than
            ``max_num_batched_tokens``, a non-numeric value, ``temperature < 0``, ``top_p`` outside (0, 1], a
            non-integer seed, ``stop_token_ids`` that is not a list of ints.
    """
    check_sampling_params(params, owner=owner)
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError(f"{owner}: prompt_ids is empty; a request needs at least one prompt token")
    bad = [t for t in prompt if t < 0 or (limits.vocab_size is not None and t >= limits.vocab_size)]
    if bad:
        raise ValueError(f"{owner}: prompt_ids {bad[:5]} are outside the vocabulary [0, {limits.vocab_size})")
    room = None if limits.context_limit is None else limits.context_limit - len(prompt)
    if room is not None and room < 1:
        raise ValueError(
            f"{owner}: the prompt has {len(prompt)} tokens, leaving no room to generate within "
            f"{limits.context_source}={limits.context_limit}; shorten the prompt or raise {limits.context_source}"
        )
    if limits.max_num_batched_tokens is not None and len(prompt) > limits.max_num_batched_tokens:
        raise ValueError(
            f"{owner}: the prompt has {len(prompt)} tokens, more than {ROLLOUT}.max_num_batched_tokens="
            f"{limits.max_num_batched_tokens} (the hf engine prefills whole prompts); raise max_num_batched_tokens"
        )
    temperature = _number(params, "temperature", 1.0, float, owner)
    top_p, top_k = _number(params, "top_p", 1.0, float, owner), _number(params, "top_k", -1, int, owner)
    if temperature < 0:
        raise ValueError(f"{owner}: sampling_params['temperature'] must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"{owner}: sampling_params['top_p'] must be in (0, 1], got {top_p}")
    sampling = SamplingParams(do_sample=temperature > 0, temperature=temperature, top_p=top_p, top_k=top_k)
    requested = _number(params, "max_tokens", 0, int, owner)
    max_tokens = requested if room is None else min(requested, room)
    request = Request(prompt, sampling, max_tokens, 0 if sampling.greedy else max(max_tokens, limits.response_length))
    seed = params.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"{owner}: sampling_params['seed'] must be an int or None, got {seed!r}")
    request.seed = None if seed is None else int(seed)
    stops = params.get("stop_token_ids") or []
    if isinstance(stops, str | bytes | numbers.Number) or not all(isinstance(t, numbers.Integral) for t in stops):
        raise ValueError(f"{owner}: sampling_params['stop_token_ids'] must be a list of ints, got {stops!r}")
    request.stop_ids = limits.eos_token_ids | frozenset(int(t) for t in stops)
    request.want_logprobs = bool(params.get("logprobs", False))
    return request


__all__ = ["Request", "RequestLimits", "parse_request"]
