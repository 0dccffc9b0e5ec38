"""Fill in the null "follow" values, like verl's ``${...}`` interpolations, so consumers see concrete values.

| key (when null)                                       | becomes                                  |
|-------------------------------------------------------|------------------------------------------|
| actor_rollout_ref.model.tokenizer_path                | actor_rollout_ref.model.path             |
| actor_rollout_ref.actor.checkpoint.load_contents      | actor checkpoint.save_contents           |
| actor_rollout_ref.rollout.prompt_length               | data.max_prompt_length                   |
| actor_rollout_ref.rollout.response_length             | data.max_response_length                 |
| actor_rollout_ref.rollout.placement                   | standalone if rollout.nnodes > 0 else hybrid |
| rollout / ref log_prob_micro_batch_size_per_gpu       | actor.ppo_micro_batch_size_per_gpu       |
| rollout / ref log_prob_use_dynamic_bsz                | actor.use_dynamic_bsz                    |
| rollout / ref log_prob_max_token_len_per_gpu          | actor.ppo_max_token_len_per_gpu          |
| critic.enable                                         | algorithm.adv_estimator == "gae"         |
| critic.strategy, ppo_mini_batch_size, ppo_micro_batch_size_per_gpu, use_dynamic_bsz, ppo_epochs, shuffle, loss_agg_mode | the actor's |
| critic.model.path / tokenizer_path                    | the actor model's path / tokenizer_path  |
| critic.checkpoint.load_contents                       | critic checkpoint.save_contents          |
| reward_model.model.tokenizer_path                     | reward_model.model.path                  |
| trainer.default_local_dir                             | checkpoints/<project_name>/<experiment_name> (``<run_dir>/checkpoints`` with ``verl train --run-dir``: :mod:`verl.config.run_dir`) |

Machine-dependent values (``trainer.device``) stay null: they are resolved where they are used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from verl.config.schema import RootConfig

_Rule = tuple[str, Callable[[RootConfig], Any]]

_ACTOR = "actor_rollout_ref.actor"

# Order matters: a rule may read a value filled by an earlier rule (critic.model.tokenizer_path).
_RULES: tuple[_Rule, ...] = (
    ("actor_rollout_ref.model.tokenizer_path", lambda c: c.actor_rollout_ref.model.path),
    (f"{_ACTOR}.checkpoint.load_contents", lambda c: c.actor_rollout_ref.actor.checkpoint.save_contents),
    ("actor_rollout_ref.rollout.prompt_length", lambda c: c.data.max_prompt_length),
    ("actor_rollout_ref.rollout.response_length", lambda c: c.data.max_response_length),
    (
        "actor_rollout_ref.rollout.placement",
        lambda c: "standalone" if c.actor_rollout_ref.rollout.nnodes > 0 else "hybrid",
    ),
    *(
        rule
        for role in ("rollout", "ref")
        for rule in (
            (
                f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu",
                lambda c: c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu,
            ),
            (f"actor_rollout_ref.{role}.log_prob_use_dynamic_bsz", lambda c: c.actor_rollout_ref.actor.use_dynamic_bsz),
            (
                f"actor_rollout_ref.{role}.log_prob_max_token_len_per_gpu",
                lambda c: c.actor_rollout_ref.actor.ppo_max_token_len_per_gpu,
            ),
        )
    ),
    ("critic.enable", lambda c: c.algorithm.adv_estimator == "gae"),
    ("critic.strategy", lambda c: c.actor_rollout_ref.actor.strategy),
    ("critic.model.path", lambda c: c.actor_rollout_ref.model.path),
    ("critic.model.tokenizer_path", lambda c: c.actor_rollout_ref.model.tokenizer_path),
    ("critic.ppo_mini_batch_size", lambda c: c.actor_rollout_ref.actor.ppo_mini_batch_size),
    ("critic.ppo_micro_batch_size_per_gpu", lambda c: c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
    ("critic.use_dynamic_bsz", lambda c: c.actor_rollout_ref.actor.use_dynamic_bsz),
    ("critic.ppo_epochs", lambda c: c.actor_rollout_ref.actor.ppo_epochs),
    ("critic.shuffle", lambda c: c.actor_rollout_ref.actor.shuffle),
    ("critic.loss_agg_mode", lambda c: c.actor_rollout_ref.actor.loss_agg_mode),
    ("critic.checkpoint.load_contents", lambda c: c.critic.checkpoint.save_contents),
    ("reward_model.model.tokenizer_path", lambda c: c.reward_model.model.path),
    (
        "trainer.default_local_dir",
        lambda c: f"checkpoints/{c.trainer.project_name}/{c.trainer.experiment_name}",
    ),
)


def get_path(obj: Any, dotted: str) -> Any:
    """``get_path(cfg, "actor_rollout_ref.rollout.n")`` -> ``cfg.actor_rollout_ref.rollout.n``."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def replace_path(obj: Any, dotted: str, value: Any) -> Any:
    """A copy of the frozen tree ``obj`` with the value at ``dotted`` replaced (nested ``attrs.evolve``)."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return attrs.evolve(obj, **{head: value})
    return attrs.evolve(obj, **{head: replace_path(getattr(obj, head), rest, value)})


def resolve_config(cfg: RootConfig) -> RootConfig:
    """Return ``cfg`` with every null follow-value filled in (see the module table). Idempotent."""
    for dotted, source in _RULES:
        if get_path(cfg, dotted) is None:
            cfg = replace_path(cfg, dotted, source(cfg))
    return cfg
