"""Requests of the ``hf`` engine's async server: their validation and the record the decode loop keeps.

:func:`parse_request` checks a request with :func:`verl.engines.serving.validate_request` and against the
engine's limits in the caller's thread, so a bad request raises ``ValueError`` from ``generate`` itself (naming
the field and the fix) and never reaches the decode thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from verl.engines.reference.rollout_options import ROLLOUT
from verl.engines.reference.sampling import SamplingParams
from verl.engines.serving import RequestError, validate_request


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


def parse_request(
    request_id: str, prompt_ids: Sequence[int], params: Mapping[str, Any], limits: RequestLimits, *, owner: str
) -> Request:
    """A :class:`Request` for ``prompt_ids`` under ``params``, checked by :func:`verl.engines.serving.validate_request`
    and then against the engine's limits.

    ``temperature`` 0 is greedy; ``max_tokens`` is capped to the context left after the prompt; ``max_draws``
    is ``max(max_tokens, response_length)`` for a sampled request (the sync path draws ``response_length``
    uniforms per row; a CPU generator's first draws do not depend on how many are drawn), 0 when greedy;
    ``stop_ids`` are the EOS ids plus ``stop_token_ids``.

    Raises:
        RequestError (a ``ValueError``; message starts with ``owner``): every field check of ``validate_request``
            (ids outside the vocabulary, NaN / inf / non-numeric sampling values, an unknown key, ...), a prompt
            that leaves no room in the context or is longer than ``max_num_batched_tokens``.
    """
    valid = validate_request(request_id, prompt_ids, params, owner=owner, vocab_size=limits.vocab_size)
    prompt = valid.prompt_ids
    room = None if limits.context_limit is None else limits.context_limit - len(prompt)
    if room is not None and room < 1:
        raise RequestError(
            f"{owner}: the prompt has {len(prompt)} tokens, leaving no room to generate within "
            f"{limits.context_source}={limits.context_limit}; shorten the prompt or raise {limits.context_source}"
        )
    if limits.max_num_batched_tokens is not None and len(prompt) > limits.max_num_batched_tokens:
        raise RequestError(
            f"{owner}: the prompt has {len(prompt)} tokens, more than {ROLLOUT}.max_num_batched_tokens="
            f"{limits.max_num_batched_tokens} (the hf engine prefills whole prompts); raise max_num_batched_tokens"
        )
    sampling = SamplingParams(
        do_sample=not valid.greedy, temperature=valid.temperature, top_p=valid.top_p, top_k=valid.top_k
    )
    max_tokens = valid.max_tokens if room is None else min(valid.max_tokens, room)
    request = Request(prompt, sampling, max_tokens, 0 if sampling.greedy else max(max_tokens, limits.response_length))
    request.seed = valid.seed
    request.stop_ids = limits.eos_token_ids | frozenset(valid.stop_token_ids)
    request.want_logprobs = valid.logprobs
    return request


__all__ = ["Request", "RequestLimits", "parse_request"]
