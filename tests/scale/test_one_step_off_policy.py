"""One-step off-policy training (``async_training.staleness_threshold=1``) on a standalone Ray rollout pool.

The batch trained at step k+1 must have been sampled by the weights of step k-1: its ``rollout_log_probs``
(the rollout engine's own scores of the sampled tokens) are compared with the actor's log-probs of the same
tokens just before step k's update (they match) and just after it (they do not). The order of events (the
next generation starts before the step's update) comes from the trainer's timestamped event log, not from
wall-time sums, which are noisy on 2 cores.

The tests that read the recomputed ``old_log_probs`` or the ``old_log_prob`` stage's timestamps set
``actor.reuse_on_policy_log_prob=false`` (:data:`RECOMPUTE`): at one epoch and one mini-batch (this config) the
default skips that pass at staleness 1 as in the synchronous loop, which
:func:`test_default_staleness_one_skips_the_old_log_prob_pass_and_trains_the_same` checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("ray")

pytestmark = pytest.mark.multiprocess

STANDALONE = (
    "trainer.controller=ray",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=broadcast",
)
OFF_POLICY = (*STANDALONE, "async_training.staleness_threshold=1", "trainer.val_before_train=false")
#: Force the separate old_log_prob pass (the default reuses the update's own forward at one mini-batch).
RECOMPUTE = "actor_rollout_ref.actor.reuse_on_policy_log_prob=false"
#: The entropy bonus moves the weights every step, also when a step's rewards have no spread (zero advantages).
ENTROPY = "actor_rollout_ref.actor.entropy_coeff=0.01"
#: The update's metrics, equal with and without the old_log_prob pass (verl.trainer.step.old_log_prob_source).
UPDATE_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy")
#: Metrics that depend on the clock or the host, not on the computation.
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/", "memory/", "weight_sync/seconds", "weight_sync/")


def _masked_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).abs() * mask).max())


def _probing_trainer(records: dict[str, Any]) -> type:
    """A PPOTrainer that, before and after each update, scores the batch in flight with the actor."""
    from verl.trainer.ppo_trainer import PPOTrainer

    class Probing(PPOTrainer):
        def _score_in_flight(self) -> tuple[Any, torch.Tensor] | None:
            pending = self.off_policy.wait()
            if pending is None:
                return None
            joined = self._finish_generation(pending.batch, pending.future.get(), pending.n, {}, balance=False)
            lp = self.actor_rollout_wg.compute_log_prob(joined).batch["old_log_probs"]
            return joined, lp

        def _update(self, batch: Any, metrics: dict[str, Any]) -> None:
            step = self._step_in_flight
            recomputed = "old_log_probs" in batch.batch.keys()
            records["trained"][step] = {
                "uid": list(batch.non_tensor_batch["uid"]),
                "rollout_log_probs": batch.batch["rollout_log_probs"].clone(),
                "old_log_probs": batch.batch["old_log_probs"].clone() if recomputed else None,
                "old_log_prob_source": batch.meta_info["old_log_prob_source"],
                "mask": batch.batch["response_mask"].float(),
                "staleness": batch.non_tensor_batch["staleness"].tolist(),
            }
            before = self._score_in_flight()  # the batch for step+1 under the actor before this update
            super()._update(batch, metrics)
            after = self._score_in_flight()
            if before is not None:
                joined, lp_before = before
                records["in_flight"][step + 1] = {
                    "uid": list(joined.non_tensor_batch["uid"]),
                    "before": lp_before,
                    "after": after[1],
                }

        def fit(self) -> dict[str, float]:
            try:
                return super().fit()
            finally:
                records["events"] = list(self.off_policy.events)

    return Probing


def _probed_run(run_train, run_dir: Path, *extra: str) -> tuple[list[dict], dict[str, Any]]:
    """A 3-step one-step off-policy run with the probing trainer: ``(metrics rows, records)``."""
    import verl.trainer.ppo_trainer as ppo_trainer

    records: dict[str, Any] = {"trained": {}, "in_flight": {}, "events": []}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ppo_trainer, "PPOTrainer", _probing_trainer(records))
        rows = run_train(run_dir, *OFF_POLICY, ENTROPY, *extra, steps=3)
    return rows, records


@pytest.fixture(scope="module")
def recompute_run(ray_runtime, run_train, tmp_path_factory) -> tuple[list[dict], dict[str, Any]]:
    """The probed run with the old_log_prob pass forced (shared: the reference of the default run's test)."""
    return _probed_run(run_train, tmp_path_factory.mktemp("recompute") / "run", RECOMPUTE)


def _assert_sampled_by_the_previous_weights(records: dict[str, Any], tolerance: float) -> None:
    """The rows trained at steps 2 and 3 carry the log-probs of the actor before the previous step's update,
    not after it: ``tolerance`` is the engines' agreement, the update must move them 100 times further."""
    for step in (2, 3):
        probe, batch = records["in_flight"][step], records["trained"][step]
        assert probe["uid"] == batch["uid"]  # the probed rows are the rows trained at this step
        mask = batch["mask"]
        assert _masked_max_diff(batch["rollout_log_probs"], probe["before"], mask) < 1e-4
        assert _masked_max_diff(batch["rollout_log_probs"], probe["after"], mask) > 100 * max(tolerance, 1e-6)


def test_one_step_off_policy_trains_on_batches_of_the_previous_weights(recompute_run) -> None:
    rows, records = recompute_run

    assert [row["step"] for row in rows] == [1, 2, 3]
    assert [row["training/off_policy/staleness_mean"] for row in rows] == [0.0, 1.0, 1.0]
    assert [row["training/off_policy/staleness_max"] for row in rows] == [0.0, 1.0, 1.0]
    assert [row["training/off_policy/rollout_weight_version"] for row in rows] == [0.0, 0.0, 1.0]
    assert {k: set(v["staleness"]) for k, v in records["trained"].items()} == {1: {0}, 2: {1}, 3: {1}}
    # Weights go to the pool once per step after the first update: steps 2 and 3 (not step 1).
    assert "timing_s/update_weights" not in rows[0]
    assert rows[1]["timing_s/update_weights"] > 0 and rows[2]["timing_s/update_weights"] > 0

    trained = records["trained"]
    assert {v["old_log_prob_source"] for v in trained.values()} == {"recompute"}
    assert all(row["timing_s/old_log_prob"] > 0 for row in rows)
    # Step 1 is on-policy: the rollout's log-probs equal the actor's recomputed ones (the engines' agreement).
    on_policy_gap = _masked_max_diff(trained[1]["rollout_log_probs"], trained[1]["old_log_probs"], trained[1]["mask"])
    assert on_policy_gap < 1e-4
    # Sampled by the policy from before step-1's update, and not by the one after it ...
    _assert_sampled_by_the_previous_weights(records, on_policy_gap)
    for step in (2, 3):
        # ... which the old_log_prob pass recomputes (the actor at this step).
        batch = trained[step]
        assert _masked_max_diff(batch["old_log_probs"], records["in_flight"][step]["after"], batch["mask"]) < 1e-4

    # Generation of step k+1 starts before step k's update starts; the batch of step k+1 is ready only after.
    times = {(event, step): t for event, step, t in records["events"]}
    for step in (1, 2):
        assert times[("gen_launch", step + 1)] < times[("update_actor_start", step)]
        assert times[("gen_launch", step + 1)] < times[("old_log_prob_start", step)]
    assert ("gen_launch", 4) not in times  # nothing is generated past the last step


def test_default_staleness_one_skips_the_old_log_prob_pass_and_trains_the_same(
    recompute_run, run_train, tmp_path: Path
) -> None:
    reference_rows, reference = recompute_run
    rows, records = _probed_run(run_train, tmp_path / "default")  # reuse_on_policy_log_prob's default

    assert [row["step"] for row in rows] == [1, 2, 3]
    assert [row["training/off_policy/staleness_max"] for row in rows] == [0.0, 1.0, 1.0]
    trained = records["trained"]
    assert {v["old_log_prob_source"] for v in trained.values()} == {"on_policy"}
    assert all(v["old_log_probs"] is None for v in trained.values())  # no old policy column on the driver
    assert not any("timing_s/old_log_prob" in row for row in rows)
    events = {event for event, _, _ in records["events"]}
    assert "old_log_prob_start" not in events and {"update_actor_start", "gen_launch"} <= events
    times = {(event, step): t for event, step, t in records["events"]}
    for step in (1, 2):
        assert times[("gen_launch", step + 1)] < times[("update_actor_start", step)]
    # The same samples and the same update as with the pass: the old policy is the actor before the update
    # either way (ratio 1; exactly 1 here, without a second forward to disagree with).
    for row, ref in zip(rows, reference_rows, strict=True):
        assert row["critic/score/mean"] == ref["critic/score/mean"], row["step"]
        assert row["response_length/mean"] == ref["response_length/mean"], row["step"]
        assert ref["actor/grad_norm"] > 0
        for key in UPDATE_METRICS:
            assert row[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (row["step"], key)
        assert row["actor/ppo_kl"] == 0.0 and row["actor/pg_clipfrac"] == 0.0
    # It trains, one step stale: the weights move at every update and batch k+1 comes from before step k's.
    # The engines' agreement: step 1's rollout log-probs (the same samples) vs the reference run's recomputed ones.
    first = trained[1]
    gap = _masked_max_diff(first["rollout_log_probs"], reference["trained"][1]["old_log_probs"], first["mask"])
    _assert_sampled_by_the_previous_weights(records, gap)
    # The stale-vs-current diagnostics need the recomputed old policy: logged only with the pass.
    assert any(k.startswith("rollout_corr/") for k in reference_rows[1])
    assert not any(k.startswith("rollout_corr/") for row in rows for k in row)


def test_staleness_zero_is_the_synchronous_loop(ray_runtime, run_train, tmp_path: Path) -> None:
    default = run_train(tmp_path / "default", *STANDALONE, steps=2)
    explicit = run_train(tmp_path / "zero", *STANDALONE, "async_training.staleness_threshold=0", steps=2)
    assert len(default) == len(explicit) == 3
    for a, b in zip(default, explicit, strict=True):
        keys = {k for k in a if not k.startswith(VOLATILE)}
        assert keys == {k for k in b if not k.startswith(VOLATILE)}
        assert not any(k.startswith("training/off_policy/") for k in keys)
        for key in sorted(keys):
            assert b[key] == a[key], (a["step"], key)


def _dumped_inputs(run_dir: Path, step: int) -> list[str]:
    lines = (run_dir / "rollouts" / f"{step}.jsonl").read_text().splitlines()
    return [json.loads(line)["input"] for line in lines]


def test_resume_regenerates_the_batch_in_flight_with_the_checkpoint_weights(
    ray_runtime, run_train, tmp_path: Path, monkeypatch
) -> None:
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    dump = lambda d: f"trainer.rollout_data_dir={d / 'rollouts'}"  # noqa: E731
    full = run_train(full_dir, *OFF_POLICY, dump(full_dir), "trainer.test_freq=2", steps=3)
    # A 3-step run that fails in step 3: step 2's checkpoint was written while step 3's batch was in flight.
    # The default skips the old_log_prob pass here, but its fault injection point still fires (before ref).
    monkeypatch.setenv("VERL_FAULT_INJECT", "old_log_prob:3:oserror")
    with pytest.raises(OSError, match="No space left"):
        run_train(part_dir, *OFF_POLICY, dump(part_dir), "trainer.save_freq=1", steps=3)
    monkeypatch.delenv("VERL_FAULT_INJECT")
    resumed = run_train(part_dir, *OFF_POLICY, dump(part_dir), "trainer.save_freq=1", steps=3)

    assert [row["step"] for row in resumed] == [1, 2, 3]
    # The resume reads step 3's batch again (the checkpoint holds the loader state from before its read) ...
    assert _dumped_inputs(part_dir, 3) == _dumped_inputs(full_dir, 3)
    assert _dumped_inputs(part_dir, 3) != _dumped_inputs(part_dir, 2)
    # ... and generates it with the checkpoint's weights (version 2): on-policy, staleness 0.
    assert resumed[2]["training/off_policy/staleness_max"] == 0.0
    assert resumed[2]["training/off_policy/rollout_weight_version"] == 2.0
    assert "timing_s/update_weights" not in resumed[2]  # the resume's load already synced the pool
    assert full[2]["training/off_policy/staleness_max"] == 1.0
    # Validation after step 2 waited for step 3's batch and synced version 2, so step 3 had nothing to send.
    assert full[1]["timing_s/testing"] > 0 and any(k.startswith("val-") for k in full[1])
    assert "timing_s/update_weights" not in full[2]
