"""verl rollout request -> SGLang requests -> verl rollout batch (pure functions, no SGLang import).

Sources: verl ``async_sglang_server.py`` (``generate``: token ids in, ``max_new_tokens`` capped by the context,
``output_token_logprobs`` as ``(logprob, token_id, text)``), SGLang ``srt/sampling/sampling_params.py``
(``SamplingParams``: ``temperature=0`` means greedy -> ``top_k=1``; ``top_k=-1`` is the whole vocabulary and
``0`` is refused; ``sampling_seed``) and ``srt/managers/schedule_batch.py`` (a matched stop id ends the output
and stays in it; ``ignore_eos`` disables every stop id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

# Shared with the other token-in engines; re-exported here, where this engine's translation lives.
from verl.engines.prompts import row_seeds, strip_left_padding  # noqa: F401
from verl.engines.reference.sampling import SamplingParams as VerlSampling
from verl_sglang.server_args import CONTEXT_HEADROOM, PROMPT_HEADROOM

#: sleep(): what is released (verl's ServerAdapter.release at sleep_level 2: KV cache and weights).
RELEASE_TAGS = ("kv_cache", "weights")
#: wake order: the weights before the weight sync, the KV cache after it (verl engine_workers.py).
WAKE_ORDER = ("weights", "kv_cache")


def max_new_tokens_per_row(prompt_lengths: Sequence[int], response_length: int, context: int) -> list[int]:
    """``min(response_length, context - 2 - prompt_len)`` per row: what SGLang's scheduler will actually allow
    (it keeps :data:`~verl_sglang.server_args.CONTEXT_HEADROOM` positions), so the request asks for no more.

    Raises:
        ValueError: a prompt SGLang would refuse (``prompt_len > context - 7``: its scheduler aborts prompts of
            ``context_length - 6`` tokens or more, ``managers/tp_worker.py`` ``max_req_input_len``, and
            ``Engine.generate`` raises), naming the row, its length and the fix.
    """
    out = []
    for i, plen in enumerate(prompt_lengths):
        if int(plen) > context - PROMPT_HEADROOM:
            raise ValueError(
                f"prompt row {i} has {plen} tokens; the SGLang engine's context_length ({context}) takes prompts of "
                f"at most {context - PROMPT_HEADROOM} tokens (SGLang refuses context_length - 6 or more); lower "
                "data.max_prompt_length or raise actor_rollout_ref.rollout.max_model_len"
            )
        out.append(min(int(response_length), context - CONTEXT_HEADROOM - int(plen)))
    return out


def sampling_params(
    params: VerlSampling,
    *,
    max_new_tokens: int,
    stop_token_ids: Sequence[int],
    seed: int | None,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """One SGLang ``sampling_params`` dict (a ``SamplingParams``' fields) for one row.

    ``n=1`` (the trainer already repeated each prompt ``n`` times); greedy -> ``temperature=0`` (SGLang then
    takes the argmax, ``top_k=1``) with ``top_p=1``, ``top_k=-1``; ``top_k <= 0`` (verl's off value -1) -> -1
    (SGLang refuses 0); ``stop_token_ids`` = every EOS id (the matched id stays in ``output_ids``), none with
    ``ignore_eos`` (SGLang ignores them then anyway); ``sampling_seed`` only when there is a seed.
    """
    out: dict[str, Any] = {
        "n": 1,
        "max_new_tokens": int(max_new_tokens),
        "stop_token_ids": [] if ignore_eos else [int(i) for i in stop_token_ids],
        "ignore_eos": bool(ignore_eos),
    }
    if params.greedy:
        out.update(temperature=0.0, top_p=1.0, top_k=-1)
    else:
        out.update(
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k) if params.top_k > 0 else -1,
        )
    if seed is not None:
        out["sampling_seed"] = int(seed)
    return out


def _finish(meta: Mapping[str, Any]) -> tuple[str | None, str]:
    reason = meta.get("finish_reason")
    if isinstance(reason, Mapping):
        return reason.get("type"), str(reason.get("message", ""))
    return (str(reason) if reason is not None else None), ""


def collect_outputs(
    outputs: Sequence[Mapping[str, Any]], response_length: int, pad_token_id: int, want_log_probs: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SGLang ``Engine.generate`` outputs (one dict per row, input order) -> ``(responses, lengths, log_probs)``.

    Each output: ``output_ids`` (the generated ids, a matched EOS included), ``meta_info["finish_reason"]`` (a dict
    with ``type`` ``stop``/``length``/``abort``), and with log-probs ``meta_info["output_token_logprobs"]``, one
    ``(logprob, token_id, text or None)`` per generated id.

    Returns:
        ``responses`` ``(bs, response_length)`` int64 right-padded with ``pad_token_id``; ``lengths`` ``(bs,)``
        int64 (tokens generated, EOS included); ``log_probs`` ``(bs, response_length)`` float32, the chosen
        token's log-prob at each generated position (0 elsewhere, and everywhere unless ``want_log_probs``).

    Raises:
        RuntimeError: SGLang aborted a request (its message quoted), or log-probs were asked for but are missing,
            of another length than ``output_ids``, or for other tokens.
    """
    bs = len(outputs)
    responses = torch.full((bs, response_length), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((bs, response_length), dtype=torch.float32)
    lengths = torch.zeros((bs,), dtype=torch.long)
    for i, output in enumerate(outputs):
        meta = output.get("meta_info") or {}
        kind, message = _finish(meta)
        if kind == "abort":
            raise RuntimeError(f"SGLang aborted the request of row {i}: {message or 'no reason given'}")
        tokens = [int(t) for t in output.get("output_ids") or []]
        if want_log_probs:
            entries = meta.get("output_token_logprobs")
            if entries is None or len(entries) != len(tokens):
                got = "none" if entries is None else f"{len(entries)}"
                raise RuntimeError(
                    f"SGLang returned {got} output_token_logprobs for the {len(tokens)} tokens of row {i}; the request "
                    "asked for return_logprob=True"
                )
            if [int(e[1]) for e in entries] != tokens:
                raise RuntimeError(
                    f"SGLang's output_token_logprobs of row {i} are for other tokens than its output_ids"
                )
        tokens = tokens[:response_length]
        n = len(tokens)
        lengths[i] = n
        if n:
            responses[i, :n] = torch.tensor(tokens, dtype=torch.long)
            if want_log_probs:
                log_probs[i, :n] = torch.tensor([float(e[0]) for e in entries[:n]], dtype=torch.float32)
    return responses, lengths, log_probs


def wake_tags(requested: Sequence[str] | None, released: Sequence[str]) -> list[str]:
    """Tags to resume for ``wake_up(requested)`` when ``released`` are still released, in verl's order.

    ``requested`` None: every released tag; else the requested tags that are released. The trainer asks for
    ``weights`` before the weight sync and ``kv_cache`` after it (as verl's workers do, whatever
    ``rollout.multi_stage_wake_up`` says: verl reads that key nowhere), so the KV cache is not allocated while
    the sync's buckets are. SGLang raises when a tag is resumed that is not released (``offload_tags.remove``),
    so only released tags are returned.

    Raises:
        ValueError: an unknown tag.
    """
    wanted = list(WAKE_ORDER) if requested is None else list(requested)
    bad = [t for t in wanted if t not in WAKE_ORDER]
    if bad:
        raise ValueError(f"wake_up tags must be among {list(WAKE_ORDER)}, got {bad}")
    return [t for t in WAKE_ORDER if t in wanted and t in released]
