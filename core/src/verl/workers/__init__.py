"""Worker roles driven by the single controller (verl's ``verl/workers``).

:class:`~verl.workers.actor_rollout_ref.ActorRolloutRefWorker` is the hybrid engine: the
actor (training engine), the rollout engine and the reference policy live in one worker
process per rank, and weights move from actor to rollout through a checkpoint engine.
"""
