"""``examples/gsm8k_grpo_tool_smollm2_cpu.yaml``: the main job's sizes with rollout.mode=async and the code
interpreter tool; it loads and validates, its data files are the ones ``verl train`` writes when missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from verl.config import load_config
from verl.data.gsm8k_tools import default_out_dir

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "gsm8k_grpo_tool_smollm2_cpu.yaml"
MAIN = REPO / "examples" / "gsm8k_grpo_smollm2_cpu.yaml"
ROLLOUT = "actor_rollout_ref.rollout"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    keys = [loader.construct_object(k) for k, _ in node.value]
    dupes = sorted({str(k) for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"line {node.start_mark.line + 1}: duplicated key(s) {dupes}")
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _tree(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def test_unique_key_loader_catches_a_duplicate() -> None:
    with pytest.raises(ValueError, match=r"duplicated key\(s\) \['b'\]"):
        yaml.load("a:\n  b: 1\n  b: 2\n", Loader=_UniqueKeyLoader)  # noqa: S506


@pytest.mark.parametrize("path", [EXAMPLE, MAIN], ids=lambda p: p.name)
def test_no_key_is_given_twice(path: Path) -> None:
    _tree(path)


def test_sizes_are_the_main_jobs() -> None:
    tool, main = _tree(EXAMPLE), _tree(MAIN)
    for section, keys in (
        ("data", ("train_batch_size", "val_batch_size", "val_max_samples", "seed")),
        ("trainer", ("total_training_steps", "test_freq", "save_freq", "project_name", "device")),
    ):
        for key in keys:
            assert tool[section][key] == main[section][key], f"{section}.{key}"
    for role in ("actor", "rollout"):
        for key, value in main["actor_rollout_ref"][role].items():
            if key not in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
                assert tool["actor_rollout_ref"][role][key] == value, f"{role}.{key}"
    assert tool["algorithm"] == main["algorithm"] and tool["reward_model"] == main["reward_model"]
    assert tool["trainer"]["experiment_name"] == "grpo_tool_smollm2_cpu"
    for key in ("rollout_data_dir", "validation_data_dir"):
        assert tool["trainer"][key].startswith("runs/verl_gsm8k/grpo_tool_smollm2_cpu/"), key


def test_data_files_are_the_ones_verl_train_writes() -> None:
    data = _tree(EXAMPLE)["data"]
    folder = default_out_dir("code_interpreter")
    assert data["train_files"] == [str(folder / "train.parquet")]
    assert data["val_files"] == [str(folder / "test.parquet")]


def test_everything_but_the_agent_loop_validates_now() -> None:
    # With the agent keys switched off the rest (batch sizes, token budgets, reward, trainer) is checked today.
    cfg = load_config(
        str(EXAMPLE),
        [f"{ROLLOUT}.mode=sync", f"{ROLLOUT}.multi_turn.enable=false", f"{ROLLOUT}.multi_turn.tool_config_path=null"],
    )
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (400, 256)
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu >= 400 + 256


_NEEDED = ("verl.agents.tool_parser", "verl.tools.code_interpreter")


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in _NEEDED), reason=f"needs {', '.join(_NEEDED)} (being built)"
)
def test_the_whole_example_loads_from_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.tools.isolation import box_unavailable_reason

    if reason := box_unavailable_reason():  # the example's code interpreter refuses to run without a box
        pytest.skip(reason)
    monkeypatch.chdir(REPO)  # tool_config_path is relative to the current directory, as the example says
    cfg = load_config(str(EXAMPLE))
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.mode == "async" and rollout.multi_turn.enable
    assert Path(rollout.multi_turn.tool_config_path).resolve() == (
        REPO / "core" / "src" / "verl" / "tools" / "configs" / "code_interpreter_config.yaml"
    )
    assert (rollout.multi_turn.max_assistant_turns, rollout.multi_turn.max_tool_response_length) == (3, 256)
