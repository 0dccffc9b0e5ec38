"""Server-based rollout (``actor_rollout_ref.rollout.mode=async``): the token-in/token-out request contract.

In async mode a rollout engine also *serves*: the agent-loop manager (:mod:`verl.agents.manager`) runs one
coroutine per sample and each coroutine sends requests (a whole conversation's token ids so far) to a
:class:`AsyncRolloutServer`, one turn at a time, while other samples' requests are in flight. An engine gives
its server through the optional engine method ``server() -> AsyncRolloutServer``; the server shares the engine's
model, so the weight sync and sleep / wake-up of the engine keep working between steps (no request is in flight
then: :meth:`verl.agents.manager.AgentLoopManager.generate_sequences` returns only once every sample finished).

Sampling parameters (a plain ``dict``, verl's agent-loop names, read with defaults):

* ``temperature`` (float, 1.0; 0 = greedy), ``top_p`` (1.0), ``top_k`` (-1 = off);
* ``max_tokens`` (int, required): new tokens for this request; a server caps it to the room left in its
  context (``max_model_len`` minus the prompt), at least 1;
* ``logprobs`` (bool, False): return the sampler's log-prob of every token (``log_softmax(logits / T)`` at the
  chosen token, T = 1 when greedy, K09);
* ``seed`` (int | None): the request's own sampler seed; the same seed, prompt and weights give the same tokens
  whatever else the server is running (the sync path's per-row ``sample_seed``);
* ``stop_token_ids`` (list[int] | None): tokens that end the request besides the model's EOS ids (kept in the
  output, as EOS is).

Requests come from agent loops, tools and interactions, i.e. from code that parses model output: every server
checks one with :func:`validate_request` before anything reaches its sampler, and a bad field (a NaN temperature, a
float or string token id, a wrong type) is a :class:`RequestError` (``ValueError``) naming the field.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

StopReason = Literal["stop", "length", "aborted"]

#: The keys a sampling-params dict may carry; anything else is a caller's typo.
SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "max_tokens", "logprobs", "seed", "stop_token_ids"})


@attrs.frozen(kw_only=True)
class TokenOutput:
    """One request's result (verl's ``TokenOutput``, ``verl/workers/rollout/replica.py``).

    Attributes:
        token_ids: the generated token ids, EOS / stop token included when one ended the request.
        log_probs: one float per token of ``token_ids`` when the request asked for ``logprobs``, else None.
        stop_reason: ``stop`` (EOS or a stop token), ``length`` (``max_tokens`` or the context was reached) or
            ``aborted``.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: StopReason = "stop"

    def __attrs_post_init__(self) -> None:
        if self.log_probs is not None and len(self.log_probs) != len(self.token_ids):
            raise ValueError(
                f"TokenOutput: {len(self.log_probs)} log_probs for {len(self.token_ids)} token_ids (one per token)"
            )


@runtime_checkable
class AsyncRolloutServer(Protocol):
    """Serves token-in/token-out requests concurrently (verl's ``LLMServerClient.generate``)."""

    async def generate(
        self, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any]
    ) -> TokenOutput:
        """Generate a continuation of ``prompt_ids`` under ``sampling_params`` (the keys above).

        ``request_id`` names the sample (the same across its turns), for a server that caches prefixes.
        Many calls may be pending at once; none waits for the others' whole generations to finish.

        Raises:
            ValueError: an empty prompt, a prompt that leaves no room in the context, an unknown sampling key.
        """
        ...


class RequestError(ValueError):
    """A server request with a bad field: the message names the field (``prompt_ids``, ``request_id`` or
    ``sampling_params['<key>']``), the value and what is accepted. A ``ValueError``, so callers that catch bad input
    as ``ValueError`` keep working."""


@attrs.frozen(kw_only=True)
class ValidRequest:
    """One request after :func:`validate_request`: plain Python values, each checked.

    Attributes:
        prompt_ids: the prompt's token ids, ints in ``[0, vocab_size)`` (at least one).
        temperature: finite, >= 0 (0 = greedy).
        top_p: finite, in (0, 1] (1 = off).
        top_k: ``-1`` or ``0`` = off, else the number of tokens kept.
        max_tokens: new tokens asked for, >= 1 (a server still caps it to the room left in its context).
        logprobs: return the sampler's log-prob of every token.
        seed: the request's sampler seed, or None.
        stop_token_ids: extra ids that end the request (besides the model's EOS ids).
    """

    prompt_ids: list[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    logprobs: bool
    seed: int | None
    stop_token_ids: tuple[int, ...]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _field(key: str) -> str:
    return f"sampling_params[{key!r}]"


def _integer(value: Any, name: str, owner: str) -> int:
    """``value`` as an int: Python / numpy integers, or a finite float with no fractional part (a JSON client's
    ``16.0``); never a bool, a string or a fraction."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RequestError(f"{owner}: {name} must be an integer, got {value!r} ({type(value).__name__})")
    if isinstance(value, numbers.Integral):
        return int(value)
    if not math.isfinite(value) or value != int(value):
        raise RequestError(f"{owner}: {name} must be an integer, got {value!r}")
    return int(value)


def _real(value: Any, name: str, owner: str) -> float:
    """``value`` as a finite float; NaN, +-inf, bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RequestError(f"{owner}: {name} must be a number, got {value!r} ({type(value).__name__})")
    result = float(value)
    if not math.isfinite(result):
        raise RequestError(f"{owner}: {name} must be a finite number, got {result!r}")
    return result


def _token_ids(values: Any, name: str, owner: str, vocab_size: int | None) -> list[int]:
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise RequestError(f"{owner}: {name} must be a list of integer token ids, got {type(values).__name__}")
    ids = []
    for position, value in enumerate(values):
        try:  # an int, a numpy integer or a 0-d integer tensor; never a bool or a float
            token = operator.index(value)
        except TypeError:
            token = None
        if token is None or isinstance(value, bool):
            raise RequestError(
                f"{owner}: {name}[{position}] must be an integer token id, got {value!r} ({type(value).__name__})"
            )
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            bound = "" if vocab_size is None else f", {vocab_size}"
            raise RequestError(
                f"{owner}: {name}[{position}] = {token} is outside the model's vocabulary [0{bound}); "
                "send ids from the model's own tokenizer"
            )
        ids.append(int(token))
    return ids


def validate_request(
    request_id: Any, prompt_ids: Any, params: Any, *, owner: str, vocab_size: int | None = None
) -> ValidRequest:
    """Check one server request field by field, as config is checked: every rollout server calls this first.

    A request reaches a server from agent loops, interactions and tools, i.e. from code that parses model output;
    a NaN temperature, a float token id or a string ``max_tokens`` must fail here, naming the field, and never reach
    the sampler (where NaN would sample garbage silently and a float id would be truncated).

    Args:
        request_id: the sample's id: a ``str``.
        prompt_ids: a non-empty sequence of integer token ids in ``[0, vocab_size)``.
        params: the sampling dict of :data:`SAMPLING_KEYS` (``max_tokens`` required; the others default to
            temperature 1.0, top_p 1.0, top_k -1, logprobs False, seed None, no stop ids; ``None`` = the default).
        owner: names the server in messages.
        vocab_size: the model's vocabulary size (None: ids are only checked to be >= 0).

    Returns:
        :class:`ValidRequest`.

    Raises:
        RequestError (a ``ValueError``): a non-string ``request_id``; ``params`` not a mapping, an unknown key;
            ``max_tokens`` missing, < 1 or not an integer; ``temperature`` not a finite number >= 0; ``top_p`` not
            a finite number in (0, 1]; ``top_k`` not an integer >= -1; ``logprobs`` not a bool; ``seed`` not an
            integer in [-2**63, 2**64); ``stop_token_ids`` / ``prompt_ids`` not lists of integer ids in the
            vocabulary; an empty prompt.
    """
    if not isinstance(request_id, str):
        raise RequestError(f"{owner}: request_id must be a str, got {type(request_id).__name__}")
    if not isinstance(params, Mapping):
        raise RequestError(f"{owner}: sampling_params must be a dict, got {type(params).__name__}")
    unknown = sorted(str(k) for k in set(params) - SAMPLING_KEYS)
    if unknown:
        raise RequestError(f"{owner}: unknown sampling parameter(s) {unknown}; known: {sorted(SAMPLING_KEYS)}")
    if params.get("max_tokens") is None:
        raise RequestError(f"{owner}: {_field('max_tokens')} must be >= 1, got None (it is required)")
    max_tokens = _integer(params["max_tokens"], _field("max_tokens"), owner)
    if max_tokens < 1:
        raise RequestError(f"{owner}: {_field('max_tokens')} must be >= 1, got {max_tokens}")

    def get(key: str, default: Any) -> Any:
        value = params.get(key)
        return default if value is None else value

    temperature = _real(get("temperature", 1.0), _field("temperature"), owner)
    if temperature < 0:
        raise RequestError(f"{owner}: {_field('temperature')} must be >= 0 (0 = greedy), got {temperature}")
    top_p = _real(get("top_p", 1.0), _field("top_p"), owner)
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"{owner}: {_field('top_p')} must be in (0, 1] (1 = off), got {top_p}")
    top_k = _integer(get("top_k", -1), _field("top_k"), owner)
    if top_k < -1:
        raise RequestError(f"{owner}: {_field('top_k')} must be -1 or 0 (off) or a positive count, got {top_k}")
    logprobs = get("logprobs", False)
    if not isinstance(logprobs, bool):
        raise RequestError(f"{owner}: {_field('logprobs')} must be true or false, got {logprobs!r}")
    seed = params.get("seed")
    if seed is not None:
        seed = _integer(seed, _field("seed"), owner)
        if not -(2**63) <= seed < 2**64:
            raise RequestError(f"{owner}: {_field('seed')} must fit in 64 bits, got {seed}")
    stops = tuple(_token_ids(get("stop_token_ids", ()), _field("stop_token_ids"), owner, vocab_size))
    prompt = _token_ids(prompt_ids, "prompt_ids", owner, vocab_size)
    if not prompt:
        raise RequestError(f"{owner}: prompt_ids is empty; a request needs at least one prompt token")
    return ValidRequest(
        prompt_ids=prompt,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        logprobs=logprobs,
        seed=seed,
        stop_token_ids=stops,
    )


def check_sampling_params(params: Mapping[str, Any], *, owner: str) -> None:
    """Check a sampling-params dict alone (no prompt): :func:`validate_request`'s rules for ``params``.

    Raises:
        RequestError (a ``ValueError``): as :func:`validate_request`.
    """
    validate_request("-", [0], params, owner=owner)


__all__ = [
    "SAMPLING_KEYS",
    "AsyncRolloutServer",
    "RequestError",
    "StopReason",
    "TokenOutput",
    "ValidRequest",
    "check_sampling_params",
    "validate_request",
]
