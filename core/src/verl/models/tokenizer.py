"""Tokenizer loading with the settings generation needs."""

from __future__ import annotations

import os
from typing import Any


def load_tokenizer(path: str | os.PathLike[str], *, padding_side: str = "left") -> Any:
    """Load the HF tokenizer of a model for RL rollout and training.

    ``path`` is anything :func:`verl.models.resolve_model_path` accepts (a built-in name such as
    ``"smollm2-135m-instruct"`` is resolved, converting it once if needed); a folder holding only
    tokenizer files also works. The chat template saved with the model is kept.

    Settings applied:

    * ``padding_side = "left"`` (default): prompts are left-padded so every row's last prompt token sits
      at the same column and generation appends on the right (DESIGN §5).
    * a missing pad token is set to the EOS token (verl's ``hf_tokenizer`` does the same), else to the
      unknown token. Sharing one id between pad and EOS is safe in this framework because the rollout
      builds ``response_mask`` from the generated lengths, never by comparing tokens to the pad id
      (known failure K06c).

    Raises:
        ModelResolutionError (ValueError): ``path`` cannot be resolved.
        ValueError: the tokenizer has neither pad, EOS nor unknown token to pad with.
    """
    from pathlib import Path

    from transformers import AutoTokenizer

    from verl.models.resolve import BUILTIN_MODELS, resolve_model_path

    text = os.fspath(path).strip()
    folder = resolve_model_path(text) if text.lower() in BUILTIN_MODELS or not Path(text).exists() else Path(text)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError(
                f"tokenizer at {str(folder)!r} has no pad, eos or unk token; set tokenizer.pad_token explicitly"
            )
        tokenizer.pad_token = fallback
    return tokenizer
