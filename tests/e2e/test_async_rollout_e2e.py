"""``rollout.mode=async`` through ``verl train``: the agent-loop path gives the sync path's result for single-turn
prompts (same seeds -> same samples -> same update), and a tool-agent run trains with its metrics logged.

The model is a tiny random one (``make_gsm8k_workspace``), the rollout the ``hf`` engine's server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.cli.main import main as verl_main
from verl.testing.workspace import make_gsm8k_workspace

COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "response_length/mean")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    return make_gsm8k_workspace(tmp_path_factory.mktemp("async"), train=8, test=2)


def _train(ws: dict[str, Path], name: str, *extra: str) -> tuple[list[dict], Path]:
    run_dir = ws["root"] / name
    args = [
        "train",
        "--run-dir",
        str(run_dir),
        f"data.train_files=[{ws['train']}]",
        "data.val_files=null",
        "data.max_prompt_length=320",
        "data.max_response_length=12",
        "data.train_batch_size=4",
        f"actor_rollout_ref.model.path={ws['model']}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.n=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *extra,
    ]
    assert verl_main(args) == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], run_dir


def _outputs(run_dir: Path, step: int) -> list[str]:
    return [json.loads(line)["output"] for line in (run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()]


def test_async_single_turn_equals_sync(workspace):
    sync_rows, sync_dir = _train(workspace, "sync")
    async_rows, async_dir = _train(
        workspace, "async", "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.agent.num_workers=2"
    )
    for step in (1, 2):  # step 2 samples from the updated weights: the sync after the update reached the server
        assert _outputs(async_dir, step) == _outputs(sync_dir, step)
        a = next(r for r in async_rows if r["step"] == step)
        s = next(r for r in sync_rows if r["step"] == step)
        for key in COMPARED:
            assert a[key] == pytest.approx(s[key], rel=1e-4, abs=1e-6), (step, key)
        assert a["num_turns/mean"] == 2.0 and "num_turns/mean" not in s
        assert a["tool/calls"] == 0.0


def test_async_tool_agent_run_logs_agent_metrics(workspace, tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n"
        "  - class_name: verl.tools.gsm8k.Gsm8kTool\n"
        "    config: {}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: calc_gsm8k_reward\n"
        "        description: check an answer\n"
        "        parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}\n"
    )
    rows, _ = _train(
        workspace,
        "tools",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={config}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
    )
    step = next(r for r in rows if r["step"] == 1)
    for key in (
        "num_turns/mean",
        "tool/calls",
        "tool/parse_errors",
        "tool/errors",
        "agent_loop/generate_sequences/mean",
    ):
        assert key in step, key
    assert step["num_turns/min"] >= 2
    assert step["actor/grad_norm"] >= 0
