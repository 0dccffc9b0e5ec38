"""The critic and reward-model roles of a PPO step: their worker groups and the stages that use them.

Placement: each role gets its own worker group of the same controller. With
``trainer.controller=local`` (what a null controller becomes for one worker) that is an in-process :class:`LocalWorkerGroup`, so the
critic and the reward model live in the trainer's process beside the actor, as verl's colocated
default does. With ``controller=ray`` each role gets its own resource pool of
``trainer.nnodes x trainer.n_gpus_per_node`` workers (verl colocates them in the actor's placement
group; separate pools need room for both).

Reward combination (``reward_model.combine``):

* ``replace`` (default, verl's legacy reward manager: it returns ``rm_scores`` when the batch has them
  and does not run the rule scorer): ``token_level_scores = rm_scores``;
* ``sum``: ``token_level_scores = rule + rm_scores`` (both sit at the last valid response token).

Validation always scores with the rule scorers (verl validates with rule rewards).
"""

from __future__ import annotations

from typing import Any

import torch


def build_role_group(config: Any, platform: Any, worker_cls: type, name: str) -> Any:
    """A worker group of ``worker_cls(config)`` for the role ``name`` (``critic`` or ``rm``).

    ``controller=local``: one in-process worker. ``controller=ray``: a pool named ``verl_<name>`` of
    ``trainer.nnodes x trainer.n_gpus_per_node`` workers.
    """
    from verl.controller import ClassWithInitArgs, LocalWorkerGroup

    if config.trainer.controller == "local":
        return LocalWorkerGroup(ClassWithInitArgs(worker_cls, config))
    from verl.controller.ray import RayResourcePool, RayWorkerGroup

    trainer = config.trainer
    pool = RayResourcePool([trainer.n_gpus_per_node] * trainer.nnodes, platform=platform, name_prefix=f"verl_{name}")
    return RayWorkerGroup(pool, ClassWithInitArgs(worker_cls, config), name_prefix=name, platform=platform)


def combine_scores(rule: torch.Tensor | None, rm_scores: torch.Tensor, mode: str) -> torch.Tensor:
    """``token_level_scores`` from the rule scores and the reward model's ``rm_scores`` (both ``(bs, resp_len)``).

    Args:
        rule: rule-scorer token scores, or ``None`` when the scorer did not run (``replace``).
        rm_scores: reward-model scores at the last valid response token.
        mode: ``replace`` (return ``rm_scores``) or ``sum`` (``rule + rm_scores``).

    Raises:
        ValueError: unknown ``mode``, ``sum`` without rule scores, or shapes that differ.
    """
    if mode == "replace":
        return rm_scores.float()
    if mode != "sum":
        raise ValueError(f"reward_model.combine must be 'replace' or 'sum', got {mode!r}")
    if rule is None:
        raise ValueError("reward_model.combine=sum needs the rule scores (token_level_scores) of the reward step")
    if rule.shape != rm_scores.shape:
        raise ValueError(f"rule scores {tuple(rule.shape)} and rm_scores {tuple(rm_scores.shape)} differ in shape")
    return rule.float() + rm_scores.float()
