"""Inputs of the conformance suites: the test model, the rollout config, prompt batches, weight edits.

Everything is built from a config with fixed seeds (no downloads), so every engine under test sees
bit-identical weights and prompts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

# Characters of different lengths so rows need left padding; the first one makes the default model
# answer '?' (a secondary EOS id) at its very first greedy step, so EOS handling is exercised
# deterministically, not only by chance.
CONFORMANCE_PROMPTS: tuple[str, ...] = ("What is 2+3?", "hi", "Count: 1 2 3", "a longer prompt with some words")

# Extra EOS ids of the default model (its generation_config.eos_token_id), as in real chat models that
# stop on several ids (Llama-3: 128001/128008/128009, Qwen2.5: 151643/151645). Known failure K06.
SECONDARY_EOS_CHARS: tuple[str, ...] = ("?", "!", ".", "\n")


def save_conformance_model(
    path: str | Path,
    *,
    num_layers: int = 2,
    hidden_size: int = 32,
    seed: int = 0,
    logit_std: float = 0.75,
    secondary_eos: Sequence[str] = SECONDARY_EOS_CHARS,
) -> Path:
    """Write the suites' default model: the tiny Llama of :mod:`verl.testing.tiny`, sharpened, multi-EOS.

    Same architecture, tokenizer and initialisation as :func:`verl.testing.tiny.save_tiny_model`, with
    two changes that make the checks discriminating:

    * logits are scaled (through the final RMSNorm weight, which feeds only the LM head) to a standard
      deviation of ``logit_std`` over the vocabulary on :data:`CONFORMANCE_PROMPTS`. Freshly initialised
      logits have a std of about 0.07, so the distribution is nearly uniform: log-probs with and without
      the temperature would differ by about 0.03 (K09 hidden under a bf16 tolerance) and greedy argmax
      margins would be within bf16 noise. At 0.75, log-probs at T=0.7 and at T=1 differ by about 0.6 nat
      per token on sampled responses, and greedy text is stable;
    * ``generation_config.eos_token_id = [<|im_end|>, *secondary_eos]``: with the default prompts and
      sampling settings about 45% of the sampled rows end at an EOS, most of them at a secondary
      id, and the greedy answer to the first prompt is ``'?'``.

    Args:
        path: folder to create (written with ``save_pretrained``: config, weights, tokenizer).
        num_layers: decoder layers.
        hidden_size: width; 4 attention heads, so ``head_dim = hidden_size / 4`` (use 128 for engines whose
            attention kernels need ``head_dim >= 32``, e.g. vLLM's FlashAttention backend).
        seed: initialisation seed.
        logit_std: target std of the logits over the vocabulary.
        secondary_eos: characters added as EOS ids after the tokenizer's EOS.

    Returns:
        The folder path.
    """
    from verl.testing.tiny import make_tiny_model, make_tiny_tokenizer

    path = Path(path)
    tok = make_tiny_tokenizer()
    model = make_tiny_model(len(tok), num_layers=num_layers, hidden_size=hidden_size, seed=seed)
    enc = tok(list(CONFORMANCE_PROMPTS), padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        std = float(logits[enc["attention_mask"].bool()].std(dim=-1).mean())
        model.model.norm.weight.mul_(logit_std / std)
    model.generation_config.eos_token_id = [tok.eos_token_id, *tok.convert_tokens_to_ids(list(secondary_eos))]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_rollout_config(**overrides: Any) -> SimpleNamespace:
    """The suite's rollout config section (verl keys), with ``overrides`` replacing entries.

    Defaults: ``n=2, temperature=0.7, top_p=1.0, top_k=-1, do_sample=True, prompt_length=32,
    response_length=16, calculate_log_probs=True, seed=0`` and ``val_kwargs`` (greedy:
    ``n=1, do_sample=False, temperature=0.0, top_p=1.0, top_k=-1``). The temperature is not 1 so that
    log-probs computed without it fail the log-prob check (K09); ``top_p``/``top_k`` are off so the
    sampling distribution is exactly ``softmax(logits / T)``. Engine-specific keys (``dtype``,
    ``gpu_memory_utilization``, ``engine_kwargs``...) are added through ``overrides``.
    """
    values: dict[str, Any] = {
        "n": 2,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "do_sample": True,
        "prompt_length": 32,
        "response_length": 16,
        "calculate_log_probs": True,
        "val_kwargs": SimpleNamespace(n=1, do_sample=False, temperature=0.0, top_p=1.0, top_k=-1),
        "seed": 0,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def make_prompt_batch(
    tokenizer: Any, texts: Iterable[str], *, n: int = 1, extra_left_pad: int = 0, meta_info: dict | None = None
) -> Any:
    """Left-padded prompt batch as the trainer hands it to ``generate``, each prompt repeated ``n`` times.

    Returns a DataProto with ``input_ids``, ``attention_mask`` and ``position_ids``
    (``clip(cumsum(mask) - 1, 0)``), all ``(len(texts) * n, prompt_len)`` int64, where ``prompt_len`` is
    the longest tokenized prompt plus ``extra_left_pad`` columns of padding on the left. Rows are
    repeated with ``DataProto.repeat(n, interleave=True)`` (``[a, b] -> [a, a, b, b]``), as verl's
    trainer does before generation.

    Raises:
        ValueError: no texts, ``n < 1`` or ``extra_left_pad < 0``.
    """
    from verl.protocol import DataProto

    texts = list(texts)
    if not texts or n < 1 or extra_left_pad < 0:
        raise ValueError(
            f"make_prompt_batch: need texts, n >= 1, extra_left_pad >= 0 (got {len(texts)}, {n}, {extra_left_pad})"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows) + extra_left_pad
    input_ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    position_ids = torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0)
    batch = DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids},
        meta_info=dict(meta_info or {}),
    )
    return batch.repeat(n, interleave=True) if n > 1 else batch


def perturb_weights(weights: Iterable[tuple[str, torch.Tensor]], *, scale: float = 1.0, seed: int = 0) -> dict:
    """``{name: w + scale * std(w) * noise}`` for every floating tensor with ``dim >= 2`` (others copied).

    Names that alias one tensor (tied embeddings: ``model.embed_tokens.weight`` and ``lm_head.weight``)
    get the same perturbed tensor, so the result is a consistent state dict whichever alias an engine
    loads. The noise is seeded and independent of the global torch RNG. Returns new CPU tensors;
    ``scale=0`` gives plain copies (to restore the original weights later).
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    by_storage: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}
    for name, tensor in weights:
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in by_storage:
            value = tensor.detach().to("cpu", copy=True)
            if scale and value.is_floating_point() and value.dim() >= 2:
                noise = torch.randn(value.shape, generator=gen, dtype=torch.float32)
                value = (value.float() + scale * value.float().std() * noise).to(value.dtype)
            by_storage[key] = value
        out[name] = by_storage[key]
    return out


# The training kits' batch: 8 rows whose valid prompt and response lengths differ (one response is empty), so
# micro-batches of 2 rows hold 15, 14, 1 and 3 response tokens: a per-micro-batch mean (instead of the
# mini-batch token mean) or a lost empty row shows up in the loss, the gradient and the log-probs.
TRAINING_PROMPT_LENS: tuple[int, ...] = (6, 5, 4, 6, 2, 3, 1, 2)
TRAINING_RESPONSE_LENS: tuple[int, ...] = (8, 7, 6, 8, 1, 0, 2, 1)
TRAINING_PROMPT_WIDTH, TRAINING_RESPONSE_WIDTH = 6, 8
TRAINING_TEMPERATURE = 0.7


def make_training_batch(seed: int = 0) -> Any:
    """The batch the training kits feed every engine (rows as the trainer hands them to ``update_actor``).

    :func:`verl.testing.batches.ragged_rl_batch` of :data:`TRAINING_PROMPT_LENS` / :data:`TRAINING_RESPONSE_LENS`
    (left-padded prompts of width 6, right-padded responses of width 8, token ids 4-99 of the tiny
    tokenizer) plus ``advantages`` ``N(0, 1) * response_mask`` and ``old_log_probs``
    ``(-3 - U(0, 1)) * response_mask`` (float32, ``(8, 8)``), ``meta_info={"temperature": 0.7}``. Seeded
    by ``seed`` only (a private generator).
    """
    from verl.testing.batches import ragged_rl_batch

    gen = torch.Generator().manual_seed(seed)
    data = ragged_rl_batch(
        TRAINING_PROMPT_LENS,
        TRAINING_RESPONSE_LENS,
        TRAINING_PROMPT_WIDTH,
        TRAINING_RESPONSE_WIDTH,
        gen,
        meta_info={"temperature": TRAINING_TEMPERATURE},
    )
    mask = data.batch["response_mask"]
    rows, width = mask.shape
    data.batch["advantages"] = torch.randn(rows, width, generator=gen) * mask
    data.batch["old_log_probs"] = (-3.0 - torch.rand(rows, width, generator=gen)) * mask
    return data
