"""verl rollout request -> TensorRT-LLM requests -> verl rollout batch, and the sleep tags (no TensorRT-LLM import).

Facts used (NVIDIA/TensorRT-LLM ``tensorrt_llm/sampling_params.py``, ``tensorrt_llm/executor/result.py``; verl
``verl/workers/rollout/trtllm_rollout/trtllm_async_server.py``):

* ``SamplingParams.top_k``: 0 means "all logits" (verl's off value -1 becomes 0); ``temperature == 0`` (or
  ``top_k == 1``) is greedy (``params_imply_greedy_decoding``); greedy with more than one return is refused by
  the LLM API, so every request has ``n=1`` (the trainer already repeated each prompt ``n`` times).
* ``seed``: per request; None means the C++ runtime's default seed 0, the same for every request, so the ``n``
  samples of a prompt would be identical: every sampled row gets a seed of its own (:func:`row_seeds`).
* stopping: verl's settings for TensorRT-LLM's samplers. ``TRTLLMSampler``: ``end_id=-1`` and every EOS id as a
  stop token; ``TorchSampler``: the first EOS id as ``end_id`` and every EOS id as a stop token. With
  ``include_stop_str_in_output=True`` the stop token stays in ``token_ids`` (``GenerationResultBase._handle_sequence``
  strips it otherwise), so the EOS is part of the response and of ``response_mask``, as with the ``hf`` engine.
* ``logprobs``: verl asks ``TRTLLMSampler`` for ``logprobs=1`` and ``TorchSampler`` for ``0``; either way
  ``CompletionOutput.logprobs`` is a list with one entry per generated token, a ``{token_id: Logprob}`` dict
  (``TokenLogprobs``) or a float. :func:`collect_outputs` reads the entry of the token actually generated.
* sleep/wake: ``LLM.release(tags)`` / ``LLM.resume(tags)`` take ``ExecutorMemoryType`` values; verl's ``weights``
  are all of them except ``kv_cache`` and the internal ``_``-prefixed ones (``ServerAdapter._WEIGHTS_TAGS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Shared with the other token-in engines; re-exported here, where this engine's translation lives.
from verl.engines.prompts import row_seeds, strip_left_padding  # noqa: F401
from verl.engines.reference.sampling import SamplingParams as VerlSampling

#: verl's tags (``RolloutEngine.wake_up``) this engine maps onto TensorRT-LLM's memory tags.
VERL_TAGS = ("weights", "kv_cache")
KV_CACHE = "kv_cache"


def max_tokens_per_row(
    prompt_lengths: Sequence[int],
    response_length: int,
    max_seq_len: int,
    *,
    max_num_tokens: int | None = None,
    chunked_prefill: bool = False,
) -> list[int]:
    """``min(response_length, max_seq_len - prompt_len)`` per row (verl's TensorRT-LLM server cap).

    Args:
        max_num_tokens: the engine's token budget per step (``LLM(max_num_tokens=...)``); without chunked prefill
            TensorRT-LLM refuses a longer prompt (``BaseLLM._check_arguments``), so it is refused here first.

    Raises:
        ValueError: a prompt that leaves no room for one new token, or (without chunked prefill) one longer than
            ``max_num_tokens``, naming the row, its length and the fix.
    """
    out = []
    for i, plen in enumerate(prompt_lengths):
        room = int(max_seq_len) - int(plen)
        if room < 1:
            raise ValueError(
                f"prompt row {i} has {plen} tokens, which leaves no room in the TensorRT-LLM engine's max_seq_len "
                f"({max_seq_len}); lower data.max_prompt_length or raise actor_rollout_ref.rollout.max_model_len"
            )
        if max_num_tokens is not None and not chunked_prefill and int(plen) > int(max_num_tokens):
            raise ValueError(
                f"prompt row {i} has {plen} tokens, more than the engine's max_num_tokens ({max_num_tokens}), which "
                "TensorRT-LLM refuses without chunked prefill; raise actor_rollout_ref.rollout.max_num_batched_tokens "
                "or set actor_rollout_ref.rollout.enable_chunked_prefill=true"
            )
        out.append(min(int(response_length), room))
    return out


def sampling_kwargs(
    params: VerlSampling,
    *,
    max_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    sampler: str,
    logprobs: bool,
    seed: int | None,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of one ``tensorrt_llm.SamplingParams`` for one row.

    Args:
        sampler: ``"TRTLLMSampler"`` or ``"TorchSampler"`` (the engine's ``sampler_type``).
        logprobs: ask for the chosen token's log-prob (``rollout.calculate_log_probs``).
        ignore_eos: ``rollout.ignore_eos``: decode ``max_tokens`` whatever the tokens (no stop token, no end id).

    Raises:
        ValueError: an unknown sampler, or no EOS id while EOS stops generation.
    """
    if sampler not in ("TRTLLMSampler", "TorchSampler"):
        raise ValueError(f"sampler must be 'TRTLLMSampler' or 'TorchSampler', got {sampler!r}")
    eos = [int(i) for i in eos_token_ids]
    if not eos and not ignore_eos:
        raise ValueError("sampling_kwargs: no EOS token id to stop at (set one in the tokenizer or generation_config)")
    kwargs: dict[str, Any] = {
        "n": 1,
        "max_tokens": int(max_tokens),
        "end_id": -1 if ignore_eos or sampler == "TRTLLMSampler" else eos[0],
        "pad_id": int(pad_token_id),
        "stop_token_ids": [] if ignore_eos else eos,
        "include_stop_str_in_output": True,
        "ignore_eos": bool(ignore_eos),
        "detokenize": False,
        "logprobs": (1 if sampler == "TRTLLMSampler" else 0) if logprobs else None,
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


def _token_logprob(entry: Any, token: int, row: int, position: int) -> float:
    if isinstance(entry, int | float):
        return float(entry)
    if isinstance(entry, dict):
        if token not in entry:
            raise RuntimeError(
                f"TensorRT-LLM returned log-probs of tokens {sorted(entry)} at position {position} of row {row}, not "
                f"of the generated token {token}; the sampler's logprobs setting does not return the chosen token"
            )
        value = entry[token]
        return float(getattr(value, "logprob", value))
    raise RuntimeError(f"unexpected TensorRT-LLM log-prob entry {entry!r} at position {position} of row {row}")


def collect_outputs(
    outputs: Sequence[Any], response_length: int, pad_token_id: int, want_log_probs: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TensorRT-LLM ``RequestOutput``s (one per row, input order) -> ``(responses, lengths, log_probs)``.

    Returns:
        ``responses`` ``(bs, response_length)`` int64 right-padded with ``pad_token_id``; ``lengths`` ``(bs,)`` int64
        (tokens generated, EOS included); ``log_probs`` ``(bs, response_length)`` float32, the chosen token's
        log-prob at each generated position (0 elsewhere, and everywhere unless ``want_log_probs``).

    Raises:
        RuntimeError: a request with no completion, one that did not finish (``cancelled``/``timeout``), or
            log-probs asked for but missing or not of the generated token.
    """
    bs = len(outputs)
    responses = torch.full((bs, response_length), int(pad_token_id), dtype=torch.long)
    log_probs = torch.zeros((bs, response_length), dtype=torch.float32)
    lengths = torch.zeros((bs,), dtype=torch.long)
    for i, request in enumerate(outputs):
        completions = getattr(request, "outputs", None)
        if not completions:
            raise RuntimeError(f"TensorRT-LLM returned no completion for row {i}")
        completion = completions[0]
        reason = getattr(completion, "finish_reason", None)
        if reason in ("cancelled", "timeout"):
            raise RuntimeError(f"TensorRT-LLM request of row {i} did not finish (finish_reason={reason!r})")
        tokens = [int(t) for t in completion.token_ids][:response_length]
        n = len(tokens)
        lengths[i] = n
        if n:
            responses[i, :n] = torch.tensor(tokens, dtype=torch.long)
        if want_log_probs and n:
            entries = completion.logprobs
            if not entries or len(entries) < n:
                got = 0 if not entries else len(entries)
                raise RuntimeError(
                    f"TensorRT-LLM returned {got} log-probs for the {n} tokens of row {i}; the request asked for them"
                )
            log_probs[i, :n] = torch.tensor(
                [_token_logprob(entries[t], tok, i, t) for t, tok in enumerate(tokens)], dtype=torch.float32
            )
    return responses, lengths, log_probs


def release_tags(memory_tags: Sequence[str], which: str) -> list[str]:
    """TensorRT-LLM memory tags (``ExecutorMemoryType`` values) for one of verl's tags.

    ``weights``: every tag but ``kv_cache`` and the internal ``_``-prefixed ones, in the enum's order (what verl's
    ``ServerAdapter`` releases and resumes first); ``kv_cache``: ``["kv_cache"]``.

    Raises:
        ValueError: ``which`` is not ``weights``/``kv_cache``, or the installed tags lack ``kv_cache``.
    """
    if which not in VERL_TAGS:
        raise ValueError(f"wake_up tags must be among {list(VERL_TAGS)}, got {which!r}")
    if KV_CACHE not in memory_tags:
        raise ValueError(f"TensorRT-LLM's memory tags {list(memory_tags)} have no 'kv_cache'")
    if which == KV_CACHE:
        return [KV_CACHE]
    return [tag for tag in memory_tags if tag != KV_CACHE and not tag.startswith("_")]


def sleep_config_kwargs(level: int, memory_tags: Sequence[str]) -> dict[str, Any]:
    """``SleepConfig`` keyword arguments for ``sleep_level`` (a plain dict; TensorRT-LLM's pydantic model takes it).

    Level 1: ``{"kv_cache": "NONE"}`` (TensorRT-LLM's ``DEFAULT_RESTORE_MODES``: the KV cache is dropped, every
    other tag is backed up to host memory, TensorRT-LLM choosing PINNED or CPU). Level 2 also discards the weights:
    ``model_weights: NONE`` as verl sets it, or ``model`` on versions whose tags have no ``model_weights`` (the
    weights then live under ``model``).

    Raises:
        ValueError: a level other than 1 or 2.
    """
    if level not in (1, 2):
        raise ValueError(f"sleep_level must be 1 or 2, got {level!r}")
    modes = {KV_CACHE: "NONE"}
    if level == 2:
        modes["model_weights" if "model_weights" in memory_tags else "model"] = "NONE"
    return {"restore_modes": modes}
