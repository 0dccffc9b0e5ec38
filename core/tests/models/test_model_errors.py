"""Model path errors are raised by ``verl.models`` before any worker starts, name the path and the fix, and
``verl train`` prints them plainly (exit 2, no traceback). Models are built tiny from config objects."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.models import (
    MissingChatTemplateError,
    ModelNotFoundError,
    ModelResolutionError,
    check_chat_template,
    load_tokenizer,
    resolve_model_path,
)
from verl.testing.tiny import make_tiny_tokenizer, save_tiny_model


def _tiny_bert(folder: Path) -> Path:
    """An encoder (not a causal LM) saved with save_pretrained: config.json says BertModel."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=104, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
        max_position_embeddings=16,
    )  # fmt: skip
    BertModel(cfg).save_pretrained(folder)
    make_tiny_tokenizer().save_pretrained(folder)
    return folder


def _base_model_without_template(folder: Path) -> Path:
    """A tiny causal LM whose tokenizer has no chat template (like a base model's)."""
    import json

    save_tiny_model(folder, num_layers=1, hidden_size=8)
    for f in folder.glob("chat_template*"):
        f.unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_missing_path_is_file_not_found_naming_path_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "no" / "model"
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path(path)
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, ValueError)
    msg = str(err.value)
    assert str(path) in msg and "does not exist" in msg and "actor_rollout_ref.model.path" in msg
    with pytest.raises(FileNotFoundError):
        load_tokenizer(path)


def test_folder_that_is_not_a_hf_model(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "README.md").write_text("hello")
    with pytest.raises(ModelResolutionError) as err:
        resolve_model_path(folder)
    msg = str(err.value)
    assert str(folder) in msg and "no config.json" in msg and "save_pretrained" in msg


def test_encoder_model_is_not_a_causal_lm(tmp_path: Path) -> None:
    folder = _tiny_bert(tmp_path / "bert")
    with pytest.raises(ModelResolutionError) as err:
        resolve_model_path(folder)
    msg = str(err.value)
    assert str(folder) in msg and "not a causal LM" in msg and "BertModel" in msg and "ForCausalLM" in msg


def test_config_only_folder_has_no_weights(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    folder = tmp_path / "cfg_only"
    LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(folder)
    with pytest.raises(ModelResolutionError, match="no weight files .*save_pretrained"):
        resolve_model_path(folder)


def test_tokenizer_without_chat_template(tmp_path: Path) -> None:
    folder = _base_model_without_template(tmp_path / "base")
    assert load_tokenizer(folder).chat_template is None  # allowed unless asked for
    with pytest.raises(MissingChatTemplateError) as err:
        load_tokenizer(folder, require_chat_template=True)
    msg = str(err.value)
    assert str(folder) in msg and "no chat template" in msg and "tokenizer_path" in msg
    assert isinstance(err.value, ValueError)
    check_chat_template(make_tiny_tokenizer())  # has one: no error


def test_folder_without_tokenizer_files(tmp_path: Path) -> None:
    folder = save_tiny_model(tmp_path / "m", num_layers=1, hidden_size=8)
    for f in folder.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt"):
            f.unlink()
    with pytest.raises(ValueError, match="cannot load a tokenizer from .*tokenizer_path"):
        load_tokenizer(folder)


@pytest.mark.parametrize("kind", ["missing", "bert", "no-template"])
def test_verl_train_prints_model_errors_plainly(tmp_path: Path, capsys: pytest.CaptureFixture, kind: str) -> None:
    """The error comes from the driver's set-up (model path, tokenizer, dataset), before workers start."""
    from verl.cli.main import main

    if kind == "missing":
        model, needle = tmp_path / "absent", "does not exist"
    elif kind == "bert":
        model, needle = _tiny_bert(tmp_path / "bert"), "not a causal LM"
    else:
        model = _base_model_without_template(tmp_path / "base")
        needle = "no chat template"
    data = tmp_path / "train.parquet"
    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "1+1?"}]}
    pq.write_table(pa.Table.from_pylist([{**row, "reward_model": {"ground_truth": "2"}}] * 2), data)
    argv = [
        "train",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files=[{data}]",
        "data.val_files=null",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=1",
        "trainer.device=cpu",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and needle in err and str(model) in err, err
