"""Values of verl keys that this version does not build, refused with the reason and the alternative.

A key accepted and then ignored is worse than an error (issue #15), so each of these keys either works as in
verl for the values listed here or stops ``load_config`` (run by ``validate_config``):

* ``reward_model.reward_manager``: ``naive`` and ``dapo`` are built (:mod:`verl.rewards.reward_managers`);
  verl's ``batch`` and ``prime`` are refused with what to use instead; the dapo keys of
  ``reward_model.reward_kwargs`` (``max_resp_len``, ``overlong_buffer_cfg``) need ``reward_manager=dapo``
  and verl's three conditions on them, and ints where verl takes ints (the rules are
  :func:`verl.rewards.reward_managers.split_reward_kwargs`, which the trainer calls too);
* ``*.optim.total_training_steps``: verl's trainer overwrites it with the run's step count, so a value
  other than -1 would be silently replaced; here it is refused and ``trainer.total_training_steps`` named;
* ``*.checkpoint.save_contents`` / ``load_contents``: every checkpoint holds model, optimizer and extra (LR
  scheduler, counters; the RNG state is the trainer's), which exact resume needs; choosing parts is not built,
  and HF weights (``hf_model``) come from ``verl export`` of a checkpoint.
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig
from verl.config.validate_batch import ARR

CHECKPOINT_CONTENTS = frozenset({"model", "optimizer", "extra"})


def check_support(cfg: RootConfig, report: IssueCollector) -> None:
    """Add an error for every value of a key above that would not do what verl does."""
    _check_reward_manager(cfg, report)
    optims = [(f"{ARR}.actor.optim", cfg.actor_rollout_ref.actor.optim), ("critic.optim", cfg.critic.optim)]
    for prefix, optim in optims:
        if optim.total_training_steps != -1:
            report.error(
                f"{prefix}.total_training_steps",
                f"={optim.total_training_steps}: the LR schedule's length is the run's step count, set by the "
                "trainer (verl's trainer overwrites this key too); set trainer.total_training_steps instead, "
                "and leave this at -1",
            )
    checkpoints = [(f"{ARR}.actor.checkpoint", cfg.actor_rollout_ref.actor.checkpoint)]
    checkpoints.append(("critic.checkpoint", cfg.critic.checkpoint))
    for prefix, checkpoint in checkpoints:
        for key in ("save_contents", "load_contents"):
            value = getattr(checkpoint, key)
            if value is None or not value or set(value) == CHECKPOINT_CONTENTS:
                continue  # empty save_contents is validate.py's error
            report.error(
                f"{prefix}.{key}",
                f"={list(value)}: checkpoints always hold model, optimizer and extra (LR scheduler and "
                "counters), which exact resume needs; choosing parts is not built. For HF weights (hf_model) "
                "run `verl export` on a checkpoint folder",
            )


def _check_reward_manager(cfg: RootConfig, report: IssueCollector) -> None:
    # One implementation of the rules: the trainer calls the same function when it builds the manager.
    # Imported here, not at the top, so that loading verl.config does not load verl.rewards.
    from verl.rewards.reward_managers import RewardKwargsError, split_reward_kwargs

    try:
        split_reward_kwargs(cfg.reward_model.reward_manager, cfg.reward_model.reward_kwargs)
    except RewardKwargsError as error:
        report.error(error.key, error.detail)
