"""The hybrid engine's mode switches, driven by the trainer every step in verl's order.

One step alternates the devices between generation and training::

    gen (rollout awake)
      -> sleep           rollout frees its KV cache / weights            (timing_s/sleep)
      -> onload          training engines take back their offloaded state (timing_s/onload)
      -> ... rewards, log-probs, advantages, updates, checkpoint ...
      -> wake_up         rollout re-allocates its weights                (timing_s/wake_up)
      -> update_weights  trainer weights -> rollout, resharded          (timing_s/update_weights)
      -> offload         training engines move state to the host         (timing_s/offload)
      -> wake_up         rollout re-allocates its KV cache              (timing_s/wake_up, summed)

as verl's ``ActorRolloutRefWorker.update_weights`` (resume weights, sync, offload the actor, resume the KV
cache) and its trainer's ``sleep_replicas`` after generation. What each switch moves is the engines' business
(options ``free_cache_engine``, ``engine_kwargs.<rollout>.sleep_level``, ``param_offload``,
``optimizer_offload``) and the platform's (a no-op where there is nothing to free, e.g. a CPU rollout that
shares the trainer's module). Memory per switch and per phase (``memory/<switch|phase>/*_gb``) comes from the
workers; ``perf/max_memory_allocated_gb`` / ``perf/max_memory_reserved_gb`` are the step's peaks over the
phases (generation, training, weight sync), ``perf/cpu_memory_used_gb`` the host's used memory (verl's names).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from verl.trainer.placement import sync_weights
from verl.workers.switching import host_memory_used_gb, reduce_rank_metrics

Stage = Callable[[str], AbstractContextManager[Any]]


class ModeSwitcher:
    """Calls the switch methods of the worker groups and collects their metrics.

    Args:
        actor_wg: the group holding the actor (and ref) engines.
        rollout_wg: the group holding the rollout engines (``actor_wg`` itself in hybrid placement).
        critic_wg: the critic's group, offloaded / onloaded with the actor (None without a critic).
    """

    def __init__(self, actor_wg: Any, rollout_wg: Any, critic_wg: Any = None) -> None:
        self.actor_wg = actor_wg
        self.rollout_wg = rollout_wg
        self.critic_wg = critic_wg
        self.pending: dict[str, float] = {}  # metrics of enter_generation, logged with the next step

    def _trainer_groups(self) -> list[Any]:
        return [g for g in (self.actor_wg, self.critic_wg) if g is not None and hasattr(g, "offload_trainer")]

    def enter_generation(self) -> dict[str, float]:
        """Before the first step: training engines offload (the rollout starts awake with current weights).
        The metrics are also kept in :attr:`pending` for the first step's row."""
        self.pending = reduce_rank_metrics([m for g in self._trainer_groups() for m in g.offload_trainer()])
        return self.pending

    def take_pending(self) -> dict[str, float]:
        """The metrics of :meth:`enter_generation` not logged yet (then forgotten), for the next step's row."""
        pending, self.pending = self.pending, {}
        return pending

    def to_training(self, stage: Stage) -> dict[str, float]:
        """After generation: the rollout sleeps, the training engines onload."""
        per_rank: list[dict[str, float]] = []
        with stage("sleep"):
            per_rank += self.rollout_wg.sleep_rollout()
        with stage("onload"):
            for group in self._trainer_groups():
                per_rank += group.onload_trainer()
        return reduce_rank_metrics(per_rank)

    def to_generation(self, stage: Stage) -> dict[str, float]:
        """After the updates: the rollout wakes its weights, weights sync, training engines offload, the rollout
        wakes its KV cache."""
        per_rank: list[dict[str, float]] = []
        with stage("wake_up"):
            per_rank += self.rollout_wg.wake_up_rollout(["weights"])
        with stage("update_weights"):
            per_rank += sync_weights(self.actor_wg, self.rollout_wg)
        with stage("offload"):
            for group in self._trainer_groups():
                per_rank += group.offload_trainer()
        with stage("wake_up"):
            per_rank += self.rollout_wg.wake_up_rollout(["kv_cache"])
        return reduce_rank_metrics(per_rank)


def step_memory_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """verl's ``perf/max_memory_allocated_gb`` / ``perf/max_memory_reserved_gb`` (the highest phase peak of the
    step, over ranks) and ``perf/cpu_memory_used_gb`` (this host), from the phase metrics in ``metrics``."""
    out: dict[str, float] = {}
    for kind in ("allocated", "reserved"):
        peaks = [v for k, v in metrics.items() if k.startswith("memory/") and k.endswith(f"/peak_{kind}_gb")]
        if peaks:
            out[f"perf/max_memory_{kind}_gb"] = max(peaks)
    used = host_memory_used_gb()
    if used is not None:
        out["perf/cpu_memory_used_gb"] = used
    return out
