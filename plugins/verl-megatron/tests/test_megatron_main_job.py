"""The main job (``verl train``) with ``actor_rollout_ref.actor.strategy=megatron`` at tensor-parallel size 2 on 2
CPU workers through the Ray controller (``trainer.controller=ray trainer.n_gpus_per_node=2``).

The model is the tiny Llama of :mod:`verl.testing.tiny` (2 layers, width 32, 4 heads / 2 KV heads, vocab 104: TP=2
splits heads, KV groups and vocab evenly) on 8 GSM8K questions with a digit-share reward, the settings of
``tests/scale/conftest.py`` with 4 samples per prompt. Both TP ranks form one data-parallel replica, so the worker's
``actor`` mesh (from the engine's ``dispatch_info()``) hands them the same rows.

* default: 3 steps finish; every step reports finite ``actor/pg_loss``, ``actor/grad_norm``, ``timing_s/gen``
  and ``response_length/mean``; step 1's gradient is not zero;
* ``slow``: ``strategy=reference`` (one process), ``fsdp`` (DP=2 on Ray) and ``megatron`` (TP=2 on Ray) on the
  same seed give the same first step: ``critic/score/mean`` and ``response_length/mean`` within 1e-6 absolute
  (same weights, per-row sampler seeds: the same responses); ``actor/pg_loss``, ``actor/grad_norm`` and
  ``actor/entropy`` within 1e-4 relative and 1e-6 absolute (float32; the TP=2 all-reduces and FSDP's
  reduce-scatter reorder sums, about 1e-7 relative here). A sampled response of this run holds the pad id, so the
  update also checks that the pad token's embedding row gets no gradient from lookups (HF's ``padding_idx``,
  which the other engines inherit; without it megatron's grad norm was 1.2123 against 1.1462).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("ray")

pytestmark = pytest.mark.multiprocess

STEPS = 3
MEGATRON_TP2 = (
    "trainer.controller=ray",
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
)


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    from verl.controller.ray import init_ray

    init_ray({"num_cpus": 2})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    """8 training and 4 test GSM8K questions, the tiny model (2 layers, width 32) and a text-dependent reward."""
    from verl.testing.tiny import save_tiny_model
    from verl.testing.workspace import make_gsm8k_workspace

    root = tmp_path_factory.mktemp("megatron_main_job")
    model = save_tiny_model(root / "model", num_layers=2, hidden_size=32)
    return make_gsm8k_workspace(root / "ws", train=8, test=4, max_question_chars=200, model=model)


@pytest.fixture(scope="module")
def run_train(workspace) -> Callable[..., list[dict]]:
    """``run_train(run_dir, *overrides, steps=1)``: `verl train` on the tiny workspace; the rows of metrics.jsonl."""

    def run(run_dir: Path, *extra: str, steps: int = 1) -> list[dict]:
        from verl.cli.main import main as verl_main

        args = [
            "train",
            "--run-dir",
            str(run_dir),
            f"data.train_files=[{workspace['train']}]",
            f"data.val_files=[{workspace['test']}]",
            "data.max_prompt_length=320",
            "data.max_response_length=10",
            "data.train_batch_size=2",
            "data.val_batch_size=4",
            f"actor_rollout_ref.model.path={workspace['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.use_dynamic_bsz=false",
            "actor_rollout_ref.actor.optim.lr=0.01",
            # 4 samples per prompt: at n=2 both samples of each group score the same at step 1 (zero advantages,
            # zero gradient), which would make the first-step comparison vacuous.
            "actor_rollout_ref.rollout.n=4",
            f"custom_reward_function.path={workspace['reward']}",
            f"trainer.total_training_steps={steps}",
            "trainer.logger=[file]",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            *extra,
        ]
        assert verl_main(args) == 0, f"verl train {' '.join(extra)} failed"
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    return run


def _step_rows(rows: list[dict]) -> list[dict]:
    """The training steps' rows (validation-only rows carry no actor metrics), in step order."""
    steps = [row for row in rows if "actor/pg_loss" in row]
    return sorted(steps, key=lambda row: row.get("step", row.get("training/global_step", 0)))


@pytest.fixture(scope="module")
def megatron_run(ray_runtime, run_train, tmp_path_factory) -> list[dict]:
    return _step_rows(run_train(tmp_path_factory.mktemp("megatron_tp2"), *MEGATRON_TP2, steps=STEPS))


def test_three_steps_of_verl_train_on_ray_with_megatron_tp2(megatron_run: list[dict]) -> None:
    assert len(megatron_run) == STEPS, f"{len(megatron_run)} training rows in metrics.jsonl, want {STEPS}"
    for i, row in enumerate(megatron_run, start=1):
        for key in ("actor/pg_loss", "actor/grad_norm", "timing_s/gen", "response_length/mean"):
            assert key in row, f"step {i} reports no {key}; it has {sorted(row)[:20]}..."
            assert math.isfinite(float(row[key])), f"step {i}: {key} = {row[key]}"
        assert float(row["timing_s/gen"]) > 0 and float(row["response_length/mean"]) > 0, i
    # GRPO advantages of step 1 are not all zero with this seed (4 samples per prompt): the actor really trained.
    assert float(megatron_run[0]["actor/grad_norm"]) > 0, "step 1 has a zero gradient (all advantages 0?)"


@pytest.fixture(scope="module")
def first_steps(ray_runtime, run_train, megatron_run: list[dict], tmp_path_factory) -> dict[str, dict]:
    """Step 1 of ``strategy=reference`` (one process), ``fsdp`` (DP=2 on Ray) and ``megatron`` (TP=2 on Ray)."""
    pytest.importorskip("verl_fsdp")
    root = tmp_path_factory.mktemp("first_steps")
    reference = _step_rows(run_train(root / "reference", "actor_rollout_ref.actor.strategy=reference", steps=1))
    fsdp = _step_rows(
        run_train(
            root / "fsdp",
            "trainer.controller=ray",
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.strategy=fsdp",
            steps=1,
        )
    )
    return {"reference": reference[0], "fsdp": fsdp[0], "megatron": megatron_run[0]}


def _assert_same_samples(got: dict, want: dict, name: str) -> None:
    for key in ("critic/score/mean", "response_length/mean"):
        assert float(got[key]) == pytest.approx(float(want[key]), abs=1e-6), (name, key, got[key], want[key])


def _assert_same_update(got: dict, want: dict, name: str) -> None:
    # pg_loss is near 0 (GRPO advantages sum to 0 over equal-length responses at ratio 1): abs 1e-6 decides.
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
        assert float(got[key]) == pytest.approx(float(want[key]), rel=1e-4, abs=1e-6), (name, key, got[key], want[key])


@pytest.mark.slow
def test_fsdp_first_step_equals_reference(first_steps: dict[str, dict]) -> None:
    assert float(first_steps["reference"]["actor/grad_norm"]) > 0
    _assert_same_samples(first_steps["fsdp"], first_steps["reference"], "fsdp")
    _assert_same_update(first_steps["fsdp"], first_steps["reference"], "fsdp")


@pytest.mark.slow
def test_megatron_first_step_samples_equal_reference(first_steps: dict[str, dict]) -> None:
    _assert_same_samples(first_steps["megatron"], first_steps["reference"], "megatron")


@pytest.mark.slow
def test_megatron_first_step_update_equals_reference(first_steps: dict[str, dict]) -> None:
    _assert_same_update(first_steps["megatron"], first_steps["reference"], "megatron")
