"""``async_training.*``: one-step off-policy training (verl's ``async_training`` section).

verl keeps these keys in the fully async recipe's config (``verl/experimental/fully_async_policy/config/
fully_async_ppo_trainer.yaml``); its ``staleness_threshold=1`` with a fast rollout is, by its docs
(``docs/advance/fully_async.md``), the one-step off-policy mode of ``verl/experimental/one_step_off_policy``.
Here only whole steps are built: 0 (the synchronous loop) and 1 (generation of step k+1 overlaps step k's
training, :mod:`verl.trainer.off_policy`). The default is 0, not the recipe's 0.1, so a config without the
section trains exactly as before.
"""

from __future__ import annotations

import attrs

from verl.config.schema._fields import fld


@attrs.frozen(kw_only=True)
class AsyncTrainingConfig:
    """How far the rollout policy may lag behind the trained policy (in optimizer steps)."""

    staleness_threshold: float = fld(
        0, doc="policy versions a trained sample may lag behind: 0 = synchronous loop, 1 = one-step off-policy"
    )
    trigger_parameter_sync_step: int = fld(
        1, doc="training steps between weight syncs to the rollout pool; only 1 is built (verl's recipe: 4)"
    )
