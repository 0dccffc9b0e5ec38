"""Fill in the null "follow" values, like verl's ``${...}`` interpolations, so consumers see concrete values.

| key (when null)                                       | becomes                                  |
|-------------------------------------------------------|------------------------------------------|
| actor_rollout_ref.actor.strategy                      | ``model_engine`` unless ``dp``; else ``fsdp`` if world > 1 (verl's default), else ``reference`` |
| actor_rollout_ref.ref.strategy, critic.strategy       | actor.strategy (verl: ``${actor_rollout_ref.actor.strategy}``) |
| trainer.controller                                    | ``ray`` if world > 1 or the rollout has processes of its own (verl always runs Ray), else ``local`` |
| actor_rollout_ref.model.tokenizer_path                | actor_rollout_ref.model.path             |
| actor_rollout_ref.actor.checkpoint.load_contents      | actor checkpoint.save_contents           |
| actor_rollout_ref.rollout.prompt_length               | data.max_prompt_length                   |
| actor_rollout_ref.rollout.response_length             | data.max_response_length                 |
| actor_rollout_ref.rollout.placement                   | standalone if rollout.nnodes > 0 else hybrid |
| rollout / ref log_prob_micro_batch_size_per_gpu       | actor.ppo_micro_batch_size_per_gpu       |
| rollout / ref log_prob_use_dynamic_bsz                | actor.use_dynamic_bsz                    |
| rollout / ref log_prob_max_token_len_per_gpu          | actor.ppo_max_token_len_per_gpu          |
| critic.enable                                         | algorithm.adv_estimator == "gae"         |
| critic.ppo_mini_batch_size, ppo_micro_batch_size_per_gpu, use_dynamic_bsz, ppo_epochs, shuffle, loss_agg_mode | the actor's |
| critic.model.path / tokenizer_path                    | the actor model's path / tokenizer_path  |
| critic.checkpoint.load_contents                       | critic checkpoint.save_contents          |
| reward_model.model.tokenizer_path                     | reward_model.model.path                  |
| trainer.default_local_dir                             | checkpoints/<project_name>/<experiment_name> (``<run_dir>/checkpoints`` with ``verl train --run-dir``: :mod:`verl.config.run_dir`) |

"world" is ``trainer.nnodes x trainer.n_gpus_per_node``. verl's own defaults (``fsdp``, Ray) are kept for every
run that needs more than one process; a one-worker run gets core's in-process defaults, which need no plugin
and no Ray. An explicit value is never replaced. :func:`resolve_config` can say which keys it filled and why
(``verl config show`` prints it).

Machine-dependent values (``trainer.device``) stay null: they are resolved where they are used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from verl.config.placement import rollout_placement, trainer_world_size
from verl.config.schema import RootConfig

_Rule = tuple[str, Callable[[RootConfig], Any]]

_ACTOR = "actor_rollout_ref.actor"


def strategy_for(model_engine: str, nnodes: int, n_gpus_per_node: int) -> str:
    """The training engine a null ``actor.strategy`` becomes (see the module table).

    ``model_engine`` other than ``dp`` names the engine; otherwise ``fsdp`` for a trainer world
    (``nnodes x n_gpus_per_node`` processes) above 1, else core's single-process ``reference``.
    Shared by :func:`default_strategy` and the raw-tree alias translation (:mod:`verl.config.aliases`).
    """
    if model_engine != "dp":
        return model_engine
    return "fsdp" if int(nnodes) * int(n_gpus_per_node) > 1 else "reference"


def default_strategy(cfg: RootConfig) -> str:
    """:func:`strategy_for` of the config's ``model_engine`` and trainer world."""
    return strategy_for(cfg.model_engine, cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node)


def default_controller(cfg: RootConfig) -> str:
    """The controller a null ``trainer.controller`` becomes: ``ray`` when the run needs more than one process."""
    return "ray" if trainer_world_size(cfg) > 1 or rollout_placement(cfg) != "hybrid" else "local"


def _world_note(cfg: RootConfig) -> str:
    world = trainer_world_size(cfg)
    return (
        f"world {world} = trainer.nnodes {cfg.trainer.nnodes} x trainer.n_gpus_per_node {cfg.trainer.n_gpus_per_node}"
    )


def _strategy_why(cfg: RootConfig) -> str:
    if cfg.model_engine != "dp":
        return f"null: model_engine={cfg.model_engine}"
    if trainer_world_size(cfg) > 1:
        return f"null: {_world_note(cfg)} > 1, verl's default"
    return f"null: {_world_note(cfg)}, core's single-process engine (fsdp when the world is larger)"


def _controller_why(cfg: RootConfig) -> str:
    if trainer_world_size(cfg) > 1:
        return f"null: {_world_note(cfg)} > 1, verl's Ray workers"
    if rollout_placement(cfg) != "hybrid":
        return f"null: rollout placement {rollout_placement(cfg)} runs its own processes (Ray actors)"
    return f"null: {_world_note(cfg)}, one in-process worker (ray when the run needs more processes)"


#: Why a rule filled a key, for the keys whose value depends on more than one other key.
_WHY: dict[str, Callable[[RootConfig], str]] = {
    f"{_ACTOR}.strategy": _strategy_why,
    "trainer.controller": _controller_why,
    "actor_rollout_ref.ref.strategy": lambda c: f"null: the actor's ({c.actor_rollout_ref.actor.strategy})",
    "critic.strategy": lambda c: f"null: the actor's ({c.actor_rollout_ref.actor.strategy})",
}

# Order matters: a rule may read a value filled by an earlier rule (critic.model.tokenizer_path).
_RULES: tuple[_Rule, ...] = (
    (f"{_ACTOR}.strategy", default_strategy),
    ("actor_rollout_ref.ref.strategy", lambda c: c.actor_rollout_ref.actor.strategy),
    ("actor_rollout_ref.model.tokenizer_path", lambda c: c.actor_rollout_ref.model.path),
    (f"{_ACTOR}.checkpoint.load_contents", lambda c: c.actor_rollout_ref.actor.checkpoint.save_contents),
    ("actor_rollout_ref.rollout.prompt_length", lambda c: c.data.max_prompt_length),
    ("actor_rollout_ref.rollout.response_length", lambda c: c.data.max_response_length),
    (
        "actor_rollout_ref.rollout.placement",
        lambda c: "standalone" if c.actor_rollout_ref.rollout.nnodes > 0 else "hybrid",
    ),
    ("trainer.controller", default_controller),
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


def resolve_config(cfg: RootConfig, filled: dict[str, str] | None = None) -> RootConfig:
    """Return ``cfg`` with every null follow-value filled in (see the module table). Idempotent.

    Args:
        cfg: a config, possibly with null follow-values.
        filled: if given, gains ``{dotted key: why}`` for the strategies and the controller this call filled
            (``"null: world 8 = trainer.nnodes 1 x trainer.n_gpus_per_node 8 > 1, verl's default"``).
    """
    for dotted, source in _RULES:
        if get_path(cfg, dotted) is None:
            cfg = replace_path(cfg, dotted, source(cfg))
            if filled is not None and dotted in _WHY:
                filled[dotted] = _WHY[dotted](cfg)
    return cfg
