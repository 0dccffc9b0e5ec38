"""verl rollout request -> vLLM requests -> verl rollout batch (pure functions, no vLLM import).

Source of the translation: verl ``verl/workers/rollout/vllm_rollout/vllm_async_server.py`` and
``verl/experimental/agent_loop`` (anatomy §6.2): one response per row (the trainer already repeated each
prompt ``n`` times), ``max_tokens = min(response_length, max_model_len - prompt_len)``, ``logprobs=0``
for the chosen token's log-prob, greedy validation through ``val_kwargs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Shared with the other token-in engines; re-exported here, where this engine's translation lives.
from verl.engines.prompts import row_seeds, strip_left_padding  # noqa: F401
from verl.engines.reference.sampling import SamplingParams as VerlSampling


def max_tokens_per_row(prompt_lengths: Sequence[int], response_length: int, max_model_len: int) -> list[int]:
    """``min(response_length, max_model_len - prompt_len)`` per row (verl's vLLM server cap).

    Raises:
        ValueError: a prompt leaves no room for one new token (``prompt_len >= max_model_len``), naming the
            row, its length and the fix.
    """
    out = []
    for i, plen in enumerate(prompt_lengths):
        room = max_model_len - int(plen)
        if room < 1:
            raise ValueError(
                f"prompt row {i} has {plen} tokens, which leaves no room in the vLLM engine's max_model_len "
                f"({max_model_len}); lower data.max_prompt_length or raise "
                "actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len"
            )
        out.append(min(int(response_length), room))
    return out


def sampling_kwargs(
    params: VerlSampling,
    *,
    max_tokens: int,
    stop_token_ids: Sequence[int],
    logprobs: bool,
    seed: int | None,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of one ``vllm.SamplingParams`` for one row.

    ``ignore_eos`` (``rollout.ignore_eos``): decode ``max_tokens`` whatever the tokens; the EOS ids are then
    not stop tokens either (vLLM stops at ``stop_token_ids`` even with ``ignore_eos``).

    ``n=1``; greedy -> ``temperature=0`` (vLLM then also resets top-p/top-k); ``top_k <= 0`` (verl's off
    value -1) -> 0, vLLM's "disabled"; ``stop_token_ids`` = every EOS id (the EOS stays in the output,
    K06); ``logprobs=0`` returns the chosen token's log-prob; ``detokenize=False`` (token-out only).
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": int(max_tokens),
        "stop_token_ids": [] if ignore_eos else [int(i) for i in stop_token_ids],
        "ignore_eos": bool(ignore_eos),
        "logprobs": 0 if logprobs else None,
        "detokenize": False,
        "seed": seed,
    }
    if params.greedy:
        kwargs["temperature"] = 0.0
    else:
        kwargs.update(
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k) if params.top_k > 0 else 0,
        )
    return kwargs


def collect_outputs(
    outputs: Sequence[Any], response_length: int, pad_token_id: int, want_log_probs: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM ``RequestOutput``s (one per row, input order) -> ``(responses, lengths, log_probs)``.

    Returns:
        ``responses`` ``(bs, response_length)`` int64 right-padded with ``pad_token_id``; ``lengths`` ``(bs,)``
        int64 (tokens generated, EOS included); ``log_probs`` ``(bs, response_length)`` float32, the chosen
        token's log-prob at each generated position (0 elsewhere, and everywhere unless ``want_log_probs``).

    Raises:
        RuntimeError: a request returned no completion, or log-probs were asked for but are missing.
    """
    bs = len(outputs)
    responses = torch.full((bs, response_length), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((bs, response_length), dtype=torch.float32)
    lengths = torch.zeros((bs,), dtype=torch.long)
    for i, request in enumerate(outputs):
        if not request.outputs:
            raise RuntimeError(f"vLLM returned no completion for row {i} (request {request.request_id})")
        completion = request.outputs[0]
        tokens = list(completion.token_ids)[:response_length]
        n = len(tokens)
        lengths[i] = n
        if n:
            responses[i, :n] = torch.tensor(tokens, dtype=torch.long)
        if want_log_probs and n:
            if completion.logprobs is None:
                raise RuntimeError(f"vLLM returned no log-probs for row {i}; the request asked for logprobs=0")
            log_probs[i, :n] = torch.tensor(
                [completion.logprobs[t][tok].logprob for t, tok in enumerate(tokens)], dtype=torch.float32
            )
    return responses, lengths, log_probs
