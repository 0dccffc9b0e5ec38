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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def check_sampling_params(params: Mapping[str, Any], *, owner: str) -> None:
    """Refuse a sampling-params dict with an unknown key or without ``max_tokens`` (ValueError naming it)."""
    unknown = sorted(set(params) - SAMPLING_KEYS)
    if unknown:
        raise ValueError(f"{owner}: unknown sampling parameter(s) {unknown}; known: {sorted(SAMPLING_KEYS)}")
    if int(params.get("max_tokens") or 0) < 1:
        raise ValueError(f"{owner}: sampling_params['max_tokens'] must be >= 1, got {params.get('max_tokens')!r}")


__all__ = ["SAMPLING_KEYS", "AsyncRolloutServer", "StopReason", "TokenOutput", "check_sampling_params"]
