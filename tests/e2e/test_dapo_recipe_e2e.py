"""`verl train --config-name dapo_trainer` with a DAPO recipe script's own keys: two steps with a tiny model.

The recipe's keys are used as its scripts write them (``reward_model.overlong_buffer.*``, the global micro-batch
keys at null), over verl's defaults plus the recipe's config. Even-index prompts score a constant (their groups
are dropped by dynamic sampling), odd ones a character sum of the response, so every trained group varies.
Each dumped sample's score is the scorer's value plus verl's overlong penalty, which with the buffer as long as
the response budget is ``-L / max_response_length`` for a response of L tokens: the test takes L back out of
each score and checks it against the logged mean response length.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl.cli.main import main as verl_main
from verl.config.yaml_io import load_yaml
from verl.testing.workspace import make_gsm8k_workspace

PROMPTS, TRAIN_BSZ, GEN_BSZ, N, STEPS, MAX_RESP = 6, 2, 3, 2, 2, 8

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2 == 0:
        return {"score": 0.5, "acc": 0.0}
    return {"score": sum((i + 1) * ord(c) for i, c in enumerate(solution_str)) / 1e4, "acc": 1.0}
"""


def _raw_score(index: int, solution: str) -> float:
    if index % 2 == 0:
        return 0.5
    return sum((i + 1) * ord(c) for i, c in enumerate(solution)) / 1e4


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[dict[str, Path], Path]:
    ws = make_gsm8k_workspace(tmp_path_factory.mktemp("dapo_recipe"), train=PROMPTS, test=2, reward_source=REWARD)
    run_dir = ws["root"] / "run"
    argv = [
        "train",
        "--config-name",
        "dapo_trainer",
        "--run-dir",
        str(run_dir),
        # What the recipe's scripts set (test_dapo_7b.sh's keys, sized down).
        "algorithm.adv_estimator=grpo",
        f"data.train_files=['{ws['train']}']",
        f"data.val_files=['{ws['test']}']",
        "data.max_prompt_length=320",
        f"data.max_response_length={MAX_RESP}",
        f"data.train_batch_size={TRAIN_BSZ}",
        f"data.gen_batch_size={GEN_BSZ}",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=10",
        "reward_model.reward_manager=dapo",
        "reward_model.overlong_buffer.enable=True",
        f"reward_model.overlong_buffer.len={MAX_RESP}",
        "reward_model.overlong_buffer.penalty_factor=1.0",
        "actor_rollout_ref.actor.ppo_micro_batch_size=null",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=null",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=null",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.rollout.n={N}",
        # The tiny CPU set-up.
        f"actor_rollout_ref.model.path={ws['model']}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={TRAIN_BSZ}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"custom_reward_function.path={ws['reward']}",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
    ]
    assert verl_main(argv) == 0
    return ws, run_dir


def test_the_recipe_config_and_keys_are_what_the_run_used(run) -> None:
    _, run_dir = run
    text = (run_dir / "config.yaml").read_text()
    assert text.splitlines()[0].startswith("# base config: dapo_trainer ")
    cfg = load_yaml(text)
    assert cfg["trainer"]["project_name"] == "verl-dapo"  # from the built-in, not overridden
    assert cfg["reward_model"]["reward_manager"] == "dapo"
    assert cfg["reward_model"]["reward_kwargs"] == {
        "overlong_buffer_cfg": {"enable": True, "len": MAX_RESP, "penalty_factor": 1.0, "log": False},
        "max_resp_len": MAX_RESP,  # = data.max_response_length, as the recipe's main_dapo passes it
    }


def test_two_steps_train_kept_groups_with_the_overlong_penalty_in_each_score(run) -> None:
    ws, run_dir = run
    questions = {r["extra_info"]["question"]: r["extra_info"]["index"] for r in pq.read_table(ws["train"]).to_pylist()}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert row["train/num_gen_batches"] >= 1 and row["train/filter_groups/kept"] >= TRAIN_BSZ
        samples = [json.loads(x) for x in (run_dir / "rollouts" / f"{row['step']}.jsonl").read_text().splitlines()]
        assert len(samples) == TRAIN_BSZ * N
        indices = [next(i for q, i in questions.items() if q in s["input"]) for s in samples]
        assert all(i % 2 == 1 for i in indices)  # constant (even) groups were filtered out
        # penalty = min(-(L - (max_resp_len - len)) / len * factor, 0) = -L / MAX_RESP here.
        lengths = [-(s["score"] - _raw_score(i, s["output"])) * MAX_RESP for s, i in zip(samples, indices, strict=True)]
        assert all(abs(n - round(n)) < 1e-4 and 1 <= round(n) <= MAX_RESP for n in lengths), lengths
        assert sum(lengths) / len(lengths) == pytest.approx(row["response_length/mean"], abs=1e-4)
