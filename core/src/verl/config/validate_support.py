"""Values of verl keys that this version does not build, refused with the reason and the alternative.

A key accepted and then ignored is worse than an error (issue #15), so each of these keys either works as in
verl for the values listed here or stops ``load_config`` (run by ``validate_config``):

* ``reward_model.reward_manager``: ``naive`` and ``dapo`` are built (:mod:`verl.rewards.reward_managers`);
  verl's ``batch`` and ``prime`` are refused with what to use instead; the dapo keys of
  ``reward_model.reward_kwargs`` (``max_resp_len``, ``overlong_buffer_cfg``) need ``reward_manager=dapo``
  and verl's three conditions on them;
* ``*.optim.total_training_steps``: verl's trainer overwrites it with the run's step count, so a value
  other than -1 would be silently replaced; here it is refused and ``trainer.total_training_steps`` named;
* ``*.checkpoint.save_contents`` / ``load_contents``: every checkpoint holds model, optimizer and extra (LR
  scheduler, counters; the RNG state is the trainer's), which exact resume needs; choosing parts is not built,
  and HF weights (``hf_model``) come from ``verl export`` of a checkpoint.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig
from verl.config.validate_batch import ARR

BUILT_REWARD_MANAGERS = ("naive", "dapo")
_DAPO_KWARGS = ("max_resp_len", "overlong_buffer_cfg")
_REFUSED_MANAGERS = {
    "batch": (
        "verl's batch manager calls one compute_score(data_sources, solution_strs, ground_truths, extra_infos) "
        "per batch, which is not built; write a per-sample custom_reward_function (it runs in parallel with "
        "reward_model.num_workers)"
    ),
    "prime": (
        "verl's prime manager is naive in a process pool with a timeout: use reward_manager=naive with "
        "reward_model.isolation=process and reward_model.timeout_s=300"
    ),
}
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
    reward = cfg.reward_model
    name = reward.reward_manager
    if name not in BUILT_REWARD_MANAGERS:
        reason = _REFUSED_MANAGERS.get(name, "no such reward manager")
        close = difflib.get_close_matches(name, BUILT_REWARD_MANAGERS, n=1)
        hint = f". Did you mean {close[0]!r}?" if close else ""
        report.error("reward_model.reward_manager", f"={name!r}: {reason}; built: {list(BUILT_REWARD_MANAGERS)}{hint}")
        return
    kwargs = dict(reward.reward_kwargs)
    given = [k for k in _DAPO_KWARGS if k in kwargs]
    if name != "dapo":
        if given:
            report.error(
                f"reward_model.reward_kwargs.{given[0]}",
                "is a key of the dapo reward manager (overlong penalty); set reward_model.reward_manager=dapo",
            )
        return
    buffer = kwargs.get("overlong_buffer_cfg")
    if buffer is None:
        return
    key = "reward_model.reward_kwargs.overlong_buffer_cfg"
    if not isinstance(buffer, Mapping):
        report.error(key, "must be a mapping {enable, len, penalty_factor, log}")
        return
    unknown = sorted(set(buffer) - {"enable", "len", "penalty_factor", "log"})
    if unknown:
        report.error(key, f"has unknown keys {unknown}; use enable, len, penalty_factor, log")
    if not buffer.get("enable", False):
        return
    max_len, length = kwargs.get("max_resp_len"), buffer.get("len", 0)
    if max_len is None:
        report.error(
            "reward_model.reward_kwargs.max_resp_len",
            f"must be set when {key}.enable is true (verl's dapo scripts pass data.max_response_length)",
        )
    elif not isinstance(length, int) or not 0 < length <= int(max_len):
        report.error(f"{key}.len", f"={length!r} must be an int > 0 and <= max_resp_len={max_len}")
