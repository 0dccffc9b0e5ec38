"""Checks of DAPO's dynamic sampling keys (``algorithm.filter_groups.*``, ``data.gen_batch_size``), run by
``validate_config``.

Errors:
* ``data.gen_batch_size`` < 1;
* ``filter_groups.enable`` without a ``metric`` (verl fails at the first step, on ``non_tensor_batch[None]``);
* a ``metric`` from ``compute_score`` (anything but ``seq_reward`` / ``seq_final_reward``) while the reward model
  replaces the rule scorer (``reward_model.enable`` with ``combine=replace``): no ``compute_score`` runs, so the
  key would be missing at the first step;
* ``data.gen_batch_size`` other than ``data.train_batch_size`` with filtering off. verl's trainer then trains on
  ``gen_batch_size`` prompts a step (its dataloader batch, ``ray_trainer.py``), a batch the ``train_batch_size``
  rules (mini-batches, world size, the on-policy log-prob reuse) never checked; refused, naming the fixes.

Warnings: ``rollout.n`` = 1 with filtering (groups of one response are kept, as in verl: nothing is filtered);
``metric`` / ``max_num_gen_batches`` set with filtering off (read only with ``enable``, as in verl).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig

FG = "algorithm.filter_groups"
#: Metrics computed from the batch's reward tensors rather than read from compute_score's result.
TENSOR_METRICS = ("seq_reward", "seq_final_reward")


def check_filter_groups(cfg: RootConfig, report: IssueCollector) -> None:
    """Record the problems listed in the module docstring in ``report``."""
    fg, data = cfg.algorithm.filter_groups, cfg.data
    gen = data.gen_batch_size
    if gen is not None and gen < 1:
        report.error(
            "data.gen_batch_size",
            f"must be >= 1 (prompts per generation round) or null (= train_batch_size), got {gen}",
        )
        gen = None
    if not fg.enable:
        if gen is not None and gen != data.train_batch_size:
            report.error(
                "data.gen_batch_size",
                f"({gen}) differs from data.train_batch_size ({data.train_batch_size}) but {FG}.enable is false: "
                f"verl then trains on gen_batch_size prompts a step, which the train_batch_size checks do not "
                f"cover. Set data.gen_batch_size=null (or {data.train_batch_size}), set "
                f"data.train_batch_size={gen}, or turn on {FG}.enable with a {FG}.metric",
            )
        if fg.metric is not None or fg.max_num_gen_batches != 0:
            report.warn(f"{FG}.enable", f"is false: {FG}.metric and max_num_gen_batches are read only when it is true")
        return
    if not fg.metric or not fg.metric.strip():
        report.error(
            f"{FG}.metric",
            f"must name the value compared within a group when {FG}.enable is true: acc, score, seq_reward, "
            "seq_final_reward or another key of compute_score's dict",
        )
    elif fg.metric not in TENSOR_METRICS and cfg.reward_model.enable and cfg.reward_model.combine == "replace":
        report.error(
            f"{FG}.metric",
            f"={fg.metric!r} comes from compute_score, which does not run when the reward model replaces it "
            "(reward_model.enable with reward_model.combine=replace); use seq_reward or seq_final_reward, or "
            "reward_model.combine=sum",
        )
    if cfg.actor_rollout_ref.rollout.n == 1:
        report.warn(
            f"{FG}.enable",
            "with actor_rollout_ref.rollout.n=1 every group holds one response, and groups of one are kept (as in "
            "verl), so nothing is filtered; set rollout.n >= 2 to filter",
        )
