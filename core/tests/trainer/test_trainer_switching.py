"""The order of the hybrid engine's switches in a step, through stand-in worker groups that record calls.

Stand-ins: these groups only record what the trainer asks of them and answer with per-rank metrics; they
show the trainer's call order and metric reduction, not that any engine frees memory (the engine tests and
``tests/scale/test_hybrid_engine.py`` do that with real engines).
"""

from __future__ import annotations

from contextlib import contextmanager

from verl.trainer.switching import ModeSwitcher, step_memory_metrics


class _Future:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class RecordingGroup:
    """Stand-in for a worker group of ``world`` ranks: records ``(group, method, args)``."""

    def __init__(self, name, log, world=2):
        self.name, self.log, self.world = name, log, world

    def _per_rank(self, method, *args):
        self.log.append((self.name, method, args))
        return [
            {f"memory/{method}/rank": float(rank), "memory/gen/peak_allocated_gb": 1.0 + rank}
            for rank in range(self.world)
        ]

    def sleep_rollout(self):
        return self._per_rank("sleep_rollout")

    def wake_up_rollout(self, tags):
        return self._per_rank("wake_up_rollout", tuple(tags))

    def update_weights(self):
        return self._per_rank("update_weights")

    def sync_weights(self):
        return _Future(self._per_rank("sync_weights"))

    def offload_trainer(self):
        return self._per_rank("offload_trainer")

    def onload_trainer(self):
        return self._per_rank("onload_trainer")


def _stage_log(log):
    @contextmanager
    def stage(name):
        log.append(("stage", name, ()))
        yield

    return stage


def test_hybrid_order_matches_verl():
    log: list = []
    group = RecordingGroup("hybrid", log)
    switcher = ModeSwitcher(group, group, critic_wg=None)
    to_train = switcher.to_training(_stage_log(log))
    to_gen = switcher.to_generation(_stage_log(log))
    assert log == [
        ("stage", "sleep", ()),
        ("hybrid", "sleep_rollout", ()),
        ("stage", "onload", ()),
        ("hybrid", "onload_trainer", ()),
        ("stage", "wake_up", ()),
        ("hybrid", "wake_up_rollout", (("weights",),)),
        ("stage", "update_weights", ()),
        ("hybrid", "update_weights", ()),
        ("stage", "offload", ()),
        ("hybrid", "offload_trainer", ()),
        ("stage", "wake_up", ()),
        ("hybrid", "wake_up_rollout", (("kv_cache",),)),
    ]
    assert to_train["memory/sleep_rollout/rank"] == 1.0  # the maximum over ranks
    assert to_gen["memory/gen/peak_allocated_gb"] == 2.0


def test_separate_pools_sync_both_and_switch_the_critic_too():
    log: list = []
    actor, rollout, critic = (RecordingGroup(n, log) for n in ("actor", "rollout", "critic"))
    switcher = ModeSwitcher(actor, rollout, critic_wg=critic)
    switcher.to_training(_stage_log(log))
    switcher.to_generation(_stage_log(log))
    calls = [(g, m) for g, m, _ in log if g != "stage"]
    assert calls == [
        ("rollout", "sleep_rollout"),
        ("actor", "onload_trainer"),
        ("critic", "onload_trainer"),
        ("rollout", "wake_up_rollout"),
        ("actor", "sync_weights"),
        ("rollout", "sync_weights"),
        ("actor", "offload_trainer"),
        ("critic", "offload_trainer"),
        ("rollout", "wake_up_rollout"),
    ]
    assert switcher.enter_generation()["memory/offload_trainer/rank"] == 1.0


def test_step_peaks_are_the_highest_phase_peak():
    metrics = {
        "memory/gen/peak_allocated_gb": 3.0,
        "memory/train/peak_allocated_gb": 5.0,
        "memory/update_weights/peak_allocated_gb": 4.0,
        "memory/train/peak_reserved_gb": 6.0,
        "memory/sleep/allocated_after_gb": 9.0,  # not a peak
    }
    out = step_memory_metrics(metrics)
    assert out["perf/max_memory_allocated_gb"] == 5.0 and out["perf/max_memory_reserved_gb"] == 6.0
    assert out["perf/cpu_memory_used_gb"] > 0
