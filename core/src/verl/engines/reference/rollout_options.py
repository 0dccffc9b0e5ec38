"""How the ``hf`` rollout engine honours verl's engine keys of ``actor_rollout_ref.rollout``.

verl's rollout keys are vLLM's engine arguments. The ``hf`` engine honours those that mean something for a
transformers decode loop and refuses the others at config load (:func:`check_hf_rollout_config`, the spec's
``check_config``), naming itself and the alternative:

| key | ``hf`` engine |
|---|---|
| ``max_num_seqs`` | rows generated together (default 1024); larger batches run in chunks |
| ``max_num_batched_tokens`` | prefill budget of one chunk: rows x longest prompt of the chunk (:func:`generation_chunks`) |
| ``max_model_len`` | context limit checked with the model's ``max_position_embeddings`` |
| ``load_format`` | ``auto``/``hf``: ``from_pretrained``; ``safetensors``: only ``*.safetensors`` files |
| ``ignore_eos`` | decode to ``response_length`` whatever the tokens (rows do not finish at EOS) |
| ``enforce_eager`` | true / null only: the loop always runs eagerly (no CUDA graphs to allow) |
| ``enable_chunked_prefill`` / ``enable_prefix_caching`` | false / null only: whole prefills, no cross-request cache |
| ``gpu_memory_utilization`` | refused: the KV cache is allocated per call for the batch at hand, no pool to size |
| ``cudagraph_capture_sizes`` | null only: no CUDA graphs are captured |
| ``disable_log_stats`` | true only: the loop keeps no engine statistics to log |

Chunking changes no sample when rows carry ``sample_seed`` (each row draws from its own generator).
"""

from __future__ import annotations

from typing import Any

import torch

ROLLOUT = "actor_rollout_ref.rollout"
DEFAULT_MAX_NUM_SEQS = 1024


def check_hf_rollout_config(rollout: Any) -> list[tuple[str, str]]:
    """``(dotted key, message)`` for each engine key of ``rollout`` the ``hf`` engine cannot honour.

    Args:
        rollout: the resolved ``actor_rollout_ref.rollout`` section (``prompt_length`` filled in).
    """
    problems: list[tuple[str, str]] = []

    def refuse(name: str, message: str) -> None:
        problems.append((f"{ROLLOUT}.{name}", f"rollout engine 'hf' (rollout.name=hf) {message}"))

    if rollout.gpu_memory_utilization is not None:
        refuse(
            "gpu_memory_utilization",
            "has no memory pool to size: its KV cache is allocated per generate call for the batch at hand; "
            "remove the key (null), or use rollout.name=vllm",
        )
    if rollout.enforce_eager is False:
        refuse(
            "enforce_eager", "always runs eagerly (it captures no CUDA graphs); set true or null, or rollout.name=vllm"
        )
    if rollout.enable_chunked_prefill:
        refuse(
            "enable_chunked_prefill",
            "prefills each prompt in one forward pass; set false or null, or use rollout.name=vllm",
        )
    if rollout.enable_prefix_caching:
        refuse(
            "enable_prefix_caching",
            "keeps no KV cache across requests, so shared prefixes are not reused; set false or null, or use "
            "rollout.name=vllm",
        )
    if getattr(rollout, "cudagraph_capture_sizes", None) is not None:
        refuse(
            "cudagraph_capture_sizes",
            "captures no CUDA graphs (it always runs eagerly); remove the key (null), or use rollout.name=vllm",
        )
    if getattr(rollout, "disable_log_stats", True) is False:
        refuse(
            "disable_log_stats",
            "keeps no engine statistics (vLLM's throughput and cache logs); set true or remove the key, or use "
            "rollout.name=vllm",
        )
    budget, prompt_len = rollout.max_num_batched_tokens, rollout.prompt_length
    if budget is not None and prompt_len is not None and 0 < budget < prompt_len:
        refuse(
            "max_num_batched_tokens",
            f"prefills whole prompts, so one prompt of rollout.prompt_length={prompt_len} tokens must fit in "
            f"max_num_batched_tokens={budget}; raise it or set it to null",
        )
    return problems


def generation_chunks(
    attention_mask: torch.Tensor, max_num_seqs: int | None, max_num_batched_tokens: int | None
) -> list[tuple[int, int]]:
    """Split a left-padded batch into consecutive ``(start, stop)`` row ranges generated together.

    A chunk holds at most ``max_num_seqs`` rows (null: :data:`DEFAULT_MAX_NUM_SEQS`), and its prefill, which
    runs over ``rows x longest prompt in the chunk`` positions (all-padding columns are dropped before the
    prefill), stays within ``max_num_batched_tokens`` (null: no limit). An empty batch is one empty chunk.

    Args:
        attention_mask: ``(bs, prompt_len)``, 1 on prompt tokens.

    Raises:
        ValueError: one prompt alone is longer than ``max_num_batched_tokens``.
    """
    rows_cap = max(1, int(max_num_seqs or DEFAULT_MAX_NUM_SEQS))
    lengths = attention_mask.long().sum(dim=1).tolist()
    if not lengths:
        return [(0, 0)]
    chunks: list[tuple[int, int]] = []
    start, widest = 0, 0
    for i, length in enumerate(lengths):
        if max_num_batched_tokens is not None and length > max_num_batched_tokens:
            raise ValueError(
                f"{ROLLOUT}.max_num_batched_tokens={max_num_batched_tokens}: prompt row {i} has {length} tokens, "
                "and the hf engine prefills whole prompts; raise max_num_batched_tokens"
            )
        grown = max(widest, length)
        too_many = i - start + 1 > rows_cap
        too_long = max_num_batched_tokens is not None and (i - start + 1) * grown > max_num_batched_tokens
        if i > start and (too_many or too_long):
            chunks.append((start, i))
            start, grown = i, length
        widest = grown
    chunks.append((start, len(lengths)))
    return chunks


def context_limit(model_config: Any, rollout: Any) -> tuple[int | None, str]:
    """``(limit, where it comes from)``: the model's ``max_position_embeddings``, lowered by ``max_model_len``."""
    limit = getattr(model_config, "max_position_embeddings", None)
    own = getattr(rollout, "max_model_len", None)
    if own is not None and (limit is None or int(own) < int(limit)):
        return int(own), f"{ROLLOUT}.max_model_len"
    return limit, "max_position_embeddings"


def load_kwargs(rollout: Any) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments for ``rollout.load_format`` (``safetensors``: no pickle files).

    Raises:
        ValueError: ``dummy`` or an unknown format (the config check refuses them first).
    """
    fmt = getattr(rollout, "load_format", None) or "auto"
    if fmt in ("auto", "hf"):
        return {}
    if fmt == "safetensors":
        return {"use_safetensors": True}
    raise ValueError(
        f"{ROLLOUT}.load_format={fmt!r}: the hf engine loads a checkpoint with auto, hf or safetensors "
        "(dummy would sample from random weights until the first sync)"
    )
