"""A disk cache of encoded prompts, so that a run's start-up tokenises a dataset once, not at every launch.

Rendering and tokenising every prompt up front (:mod:`verl.data.prompt_tokens`) is the largest part of a run's
start-up that is this framework's own time (1.25 s of 5.4 s for GSM8K's 8791 prompts on 2 cores). The result
depends only on the prompts, the tokenizer and the chat-template kwargs, so it is kept on disk under that key:

* key: SHA-256 over the cache format, the verl-core version, the tokenizer's full state (a fast tokenizer's
  serialised backend, its chat template, special tokens, class), the template kwargs and the prompts (canonical
  JSON); a slow (Python) tokenizer has no complete serialised state and is never cached;
* value: ``<cache root>/prompt_tokens/<key>.npz`` (:func:`verl.models.resolve.cache_root`): the token ids of all
  prompts end to end and each prompt's offsets, written atomically;
* a batch in which the template failed on some prompt is not stored (those errors are reported per row every
  time); a file that does not load is ignored and written again; ``VERL_PROMPT_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl.data.prompt_tokens import Encoded, encode_prompts_parallel

logger = logging.getLogger(__name__)

FORMAT = 1
ENV_SWITCH = "VERL_PROMPT_CACHE"


def _tokenizer_state(tokenizer: Any) -> str | None:
    """Everything about ``tokenizer`` that the encoding depends on, as text; None when it cannot be serialised."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    parts = {
        "class": type(tokenizer).__name__,
        "backend": backend.to_str(),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "special": {str(k): str(v) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()},
    }
    return json.dumps(parts, sort_keys=True, default=str)


def cache_key(tokenizer: Any, messages: Sequence[Any], template_kwargs: Mapping[str, Any]) -> str | None:
    """The hex key of these prompts under this tokenizer and these kwargs; None when they cannot be cached."""
    from importlib import metadata

    state = _tokenizer_state(tokenizer)
    if state is None:
        return None
    try:
        version = metadata.version("verl-core")
    except metadata.PackageNotFoundError:
        version = "unknown"
    digest = hashlib.sha256()
    for part in (str(FORMAT), version, state, json.dumps(dict(template_kwargs), sort_keys=True, default=str)):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(json.dumps(list(messages), sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _folder() -> Path:
    from verl.models.resolve import cache_root

    return cache_root() / "prompt_tokens"


def _load(path: Path, count: int) -> list[Encoded] | None:
    import numpy as np

    try:
        with np.load(path) as data:
            ids, offsets = data["ids"], data["offsets"]
        if len(offsets) != count + 1:
            return None
        return [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(count)]
    except Exception as exc:  # a truncated or foreign file: encode again and overwrite it
        logger.warning("ignoring the prompt cache file %s (%s: %s)", path, type(exc).__name__, exc)
        return None


def _store(path: Path, encoded: list[list[int]]) -> None:
    import numpy as np

    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.fromiter((t for e in encoded for t in e), dtype=np.int64, count=int(offsets[-1]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, ids=flat, offsets=offsets)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only or full cache folder costs the cache, never the run
        logger.warning("could not write the prompt cache %s: %s", path, exc)
        tmp.unlink(missing_ok=True)


def cached_encode(
    tokenizer: Any, messages: Sequence[Any], template_kwargs: Mapping[str, Any], workers: int
) -> list[Encoded]:
    """:func:`~verl.data.prompt_tokens.encode_prompts_parallel`, answered from the disk cache when it can be.

    Returns:
        per prompt, in order: its token ids, or the error text of a template that failed on it (never cached).

    Raises:
        ValueError: as :func:`~verl.data.prompt_tokens.encode_prompts_parallel` (a bad ``workers``).
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:  # checked on a cache hit too
        raise ValueError(f"data.filter_overlong_prompts_workers must be a process count >= 1, got {workers!r}")
    enabled = os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")
    key = cache_key(tokenizer, messages, template_kwargs) if enabled and messages else None
    path = _folder() / f"{key}.npz" if key else None
    if path is not None and path.exists():
        found = _load(path, len(messages))
        if found is not None:
            return found
    encoded = encode_prompts_parallel(tokenizer, messages, template_kwargs, workers)
    if path is not None and not any(isinstance(e, str) for e in encoded):
        _store(path, encoded)  # type: ignore[arg-type]  (no error texts in it)
    return encoded
