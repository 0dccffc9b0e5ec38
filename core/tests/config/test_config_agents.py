"""``rollout.mode=async`` and its ``multi_turn`` / ``agent`` keys: each does what verl's does or is refused with the
reason, at config load (no key accepted and ignored)."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config
from verl.config.backend_options import validate_backend_options

ROLLOUT = "actor_rollout_ref.rollout"


def _issues(overrides: list[str]) -> list:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return info.value.issues


def _find(issues: list, key: str):
    found = [issue for issue in issues if issue.key == key]
    assert found, [i.key for i in issues]
    return str(found[0])


def test_async_defaults_load_with_verl_values() -> None:
    cfg = load_config(overrides=[f"{ROLLOUT}.mode=async"])
    mt, agent = cfg.actor_rollout_ref.rollout.multi_turn, cfg.actor_rollout_ref.rollout.agent
    assert (mt.max_parallel_calls, mt.max_tool_response_length, mt.tool_response_truncate_side) == (1, 256, "middle")
    assert (mt.format, mt.tokenization_sanity_check_mode, mt.enable) == ("hermes", "strict", False)
    assert (agent.num_workers, agent.default_agent_loop) == (8, "single_turn_agent")


@pytest.mark.parametrize("key", ["multi_turn.enable=true", "multi_turn.tool_config_path=x.yaml"])
def test_multi_turn_keys_with_sync_mode_are_refused(key: str) -> None:
    name = key.split("=")[0]
    assert "rollout.mode=async" in _find(_issues([f"{ROLLOUT}.{key}"]), f"{ROLLOUT}.{name}")


@pytest.mark.parametrize(
    ("override", "key", "text"),
    [
        ("multi_turn.function_tool_path=t.py", "multi_turn.function_tool_path", "tool_config_path"),
        ("multi_turn.use_inference_chat_template=true", "multi_turn.use_inference_chat_template", "recorded"),
        ("multi_turn.num_repeat_rollouts=2", "multi_turn.num_repeat_rollouts", "rollout.n"),
        ("agent.custom_async_server.path=s.py", "agent.custom_async_server.path", "not built"),
        ("multi_turn.max_parallel_calls=0", "multi_turn.max_parallel_calls", ">= 1"),
        ("agent.num_workers=0", "agent.num_workers", ">= 1"),
        ("multi_turn.format=nope", "multi_turn.format", "hermes"),
        ("multi_turn.tool_config_path=/no/such.yaml", "multi_turn.tool_config_path", "/no/such.yaml"),
    ],
)
def test_async_keys_not_built_or_out_of_range_are_refused(override: str, key: str, text: str) -> None:
    assert text in _find(_issues([f"{ROLLOUT}.mode=async", f"{ROLLOUT}.{override}"]), f"{ROLLOUT}.{key}")


def test_async_with_tensor_parallel_is_refused() -> None:
    overrides = [
        f"{ROLLOUT}.mode=async",
        f"{ROLLOUT}.tensor_model_parallel_size=2",
        "trainer.controller=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.strategy=fsdp",
    ]
    assert "same requests in the same order" in _find(_issues(overrides), f"{ROLLOUT}.tensor_model_parallel_size")


def test_bad_agent_loop_file_fails_at_load(tmp_path) -> None:
    path = tmp_path / "loops.yaml"
    path.write_text("- name: x\n")
    text = _find(
        _issues([f"{ROLLOUT}.mode=async", f"{ROLLOUT}.agent.agent_loop_config_path={path}"]),
        f"{ROLLOUT}.agent.agent_loop_config_path",
    )
    assert "needs `name` and `_target_`" in text


def test_engine_without_a_server_and_unknown_default_loop(plugin_kit) -> None:
    table = plugin_kit.default_table()
    table["agent_loop"] = {"single_turn_agent": table["agent_loop"]["single_turn_agent"]}
    manager = plugin_kit.FakePluginManager(table)
    cfg = load_config(overrides=[f"{ROLLOUT}.mode=async"])
    validate_backend_options(cfg, manager)  # hf serves and the default loop exists: no error
    with pytest.raises(ConfigError) as info:
        validate_backend_options(load_config(overrides=[f"{ROLLOUT}.mode=async", f"{ROLLOUT}.name=sglang"]), manager)
    assert "capability 'async_server'" in _find(info.value.issues, f"{ROLLOUT}.mode")
    cfg = load_config(overrides=[f"{ROLLOUT}.mode=async", f"{ROLLOUT}.agent.default_agent_loop=tool_agent"])
    with pytest.raises(ConfigError) as info:
        validate_backend_options(cfg, manager)
    assert "known: ['single_turn_agent']" in _find(info.value.issues, f"{ROLLOUT}.agent.default_agent_loop")
