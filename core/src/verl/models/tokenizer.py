"""Tokenizer loading with the settings generation needs."""

from __future__ import annotations

import os
from typing import Any


class MissingChatTemplateError(ValueError):
    """The tokenizer has no chat template, so chat prompts (verl's ``prompt`` column) cannot be rendered."""


def check_chat_template(tokenizer: Any, path: str | os.PathLike[str] | None = None) -> None:
    """Raise :class:`MissingChatTemplateError` (a ``ValueError``) naming ``path`` and the fix when
    ``tokenizer.chat_template`` is empty. Base (non-instruct) models usually ship without one."""
    if getattr(tokenizer, "chat_template", None):
        return
    name = os.fspath(path) if path is not None else (getattr(tokenizer, "name_or_path", "") or "tokenizer")
    raise MissingChatTemplateError(
        f"tokenizer at {name!r} has no chat template, so chat prompts cannot be rendered; use an instruct/chat "
        "model (e.g. smollm2-135m-instruct), set actor_rollout_ref.model.tokenizer_path to a tokenizer that has "
        "one, or add a 'chat_template' to its tokenizer_config.json"
    )


def load_tokenizer(
    path: str | os.PathLike[str],
    *,
    padding_side: str = "left",
    require_chat_template: bool = False,
    trust_remote_code: bool = False,
) -> Any:
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

    With ``require_chat_template=True`` a tokenizer without a chat template is refused here (before any
    worker starts) instead of when the dataset renders its first prompt. ``trust_remote_code`` (verl's
    ``model.trust_remote_code``) lets a repository's own tokenizer class run.

    Raises:
        ModelResolutionError (ValueError): ``path`` cannot be resolved (``ModelNotFoundError``, also a
            ``FileNotFoundError``, when it does not exist).
        MissingChatTemplateError (ValueError): ``require_chat_template`` and the tokenizer has none.
        ValueError: the tokenizer has neither pad, EOS nor unknown token to pad with.
    """
    from pathlib import Path

    from transformers import AutoTokenizer

    from verl.models.resolve import BUILTIN_MODELS, resolve_model_path

    text = os.fspath(path).strip()
    folder = resolve_model_path(text) if text.lower() in BUILTIN_MODELS or not Path(text).exists() else Path(text)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:  # transformers' own errors name neither the key nor the fix
        reason = " ".join(str(exc).split())[:300]
        raise ValueError(
            f"cannot load a tokenizer from {str(folder)!r} ({type(exc).__name__}: {reason}); the folder "
            "needs tokenizer files (tokenizer.json or tokenizer_config.json + vocab): save them with "
            "tokenizer.save_pretrained(folder), or set actor_rollout_ref.model.tokenizer_path"
        ) from exc
    if require_chat_template:
        check_chat_template(tokenizer, folder)
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError(
                f"tokenizer at {str(folder)!r} has no pad, eos or unk token; set tokenizer.pad_token explicitly"
            )
        tokenizer.pad_token = fallback
    return tokenizer
