"""The SFT config: verl's keys and defaults, unknown keys with did-you-mean, verl keys not built refused with
the reason, cross-field rules, and the shipped example loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.config.errors import ConfigError
from verl.config.sft_loader import REFUSED_KEYS, load_sft_config

REPO = Path(__file__).resolve().parents[3]


def test_defaults_are_verls_and_the_run_dir_follows_the_names():
    cfg = load_sft_config(None, ["data.train_files=t.parquet", "trainer.experiment_name=e1"])
    d = cfg.data
    assert (d.train_batch_size, d.micro_batch_size_per_gpu, d.max_token_len_per_gpu, d.max_length) == (
        256,
        4,
        8192,
        1024,
    )
    assert (d.messages_key, d.truncation, d.pad_mode, d.use_dynamic_bsz) == ("messages", "error", "no_padding", True)
    assert d.train_files == ("t.parquet",)
    assert (cfg.optim.lr, cfg.trainer.total_epochs, cfg.trainer.seed) == (1e-3, 4, 1)
    assert cfg.trainer.default_local_dir == str(Path("checkpoints") / "gsm8k-sft" / "e1")


def test_unknown_refused_and_inconsistent_keys_are_all_reported():
    with pytest.raises(ConfigError) as info:
        load_sft_config(
            None,
            [
                "data.train_files=t.parquet",
                "data.max_lenght=512",
                "data.tools_key=tools",
                "data.prompt_key=question",
                "engine.strategy=fsdp",
                "trainer.n_gpus_per_node=2",
            ],
        )
    text = str(info.value)
    assert "unknown config key 'data.max_lenght' of the SFT trainer. Did you mean 'data.max_length'?" in text
    assert REFUSED_KEYS["data.tools_key"] in text
    # Unknown keys are reported before the values are checked (the tree is not structured with them).
    # `engine=reference` is verl's Hydra group choice of the engine: the strategy key here.
    with pytest.raises(ConfigError) as info:
        load_sft_config(
            None,
            [
                "data.train_files=t.parquet",
                "data.prompt_key=question",
                "engine=reference",
                "trainer.n_gpus_per_node=2",
            ],
        )
    keys = {issue.key for issue in info.value.issues}
    assert keys == {"data.response_key", "engine.strategy"}
    assert "use engine.strategy=fsdp (data parallel) or megatron for several processes" in str(info.value)


def test_missing_train_files_and_defaults_lists(tmp_path):
    with pytest.raises(ConfigError, match="data.train_files: is required"):
        load_sft_config(None, [])
    bad = tmp_path / "c.yaml"
    bad.write_text("defaults: [sft_trainer_engine, _self_]\ndata:\n  train_files: t.parquet\n")
    with pytest.raises(ConfigError, match="defaults: SFT config files are not composed"):
        load_sft_config(bad)


def test_shipped_example_loads():
    cfg = load_sft_config(REPO / "examples" / "gsm8k_sft_smollm2_cpu.yaml")
    assert cfg.model.path == "smollm2-135m-instruct" and cfg.data.max_length == 640
    assert cfg.trainer.total_training_steps == 50 and cfg.data.train_batch_size == 8
