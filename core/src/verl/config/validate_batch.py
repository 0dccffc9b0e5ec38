"""Batch-size rules: mini <= train batch, divisibility by world size, micro vs mini per GPU (K20).

Units: ``data.train_batch_size`` and ``ppo_mini_batch_size`` count prompts; a training
step holds ``train_batch_size * rollout.n`` sequences, one optimizer step
``ppo_mini_batch_size * rollout.n`` sequences shared by ``world = nnodes * n_gpus_per_node``
workers; micro-batch sizes count sequences per worker (verl ``dp_actor``/``engine_workers``).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig

ARR = "actor_rollout_ref"


def world_size(cfg: RootConfig) -> int:
    """Number of training workers: ``trainer.nnodes * trainer.n_gpus_per_node``."""
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def check_batch_sizes(cfg: RootConfig, report: IssueCollector) -> None:
    """Add batch-size errors to ``report``; ``cfg`` must be resolved (no null follow-values)."""
    world = world_size(cfg)
    n = cfg.actor_rollout_ref.rollout.n
    if world < 1 or n < 1 or cfg.data.train_batch_size < 1:
        return  # reported by the positivity rules; the arithmetic below would be meaningless
    train = cfg.data.train_batch_size
    if (train * n) % world:
        report.error(
            "data.train_batch_size",
            f"data.train_batch_size ({train}) x {ARR}.rollout.n ({n}) = {train * n} sequences must be divisible "
            f"by the world size trainer.nnodes x trainer.n_gpus_per_node = {world}",
        )
    actor = cfg.actor_rollout_ref.actor
    _check_role(
        cfg,
        report,
        f"{ARR}.actor",
        actor.ppo_mini_batch_size,
        actor.ppo_micro_batch_size_per_gpu,
        actor.use_dynamic_bsz,
        actor.ppo_max_token_len_per_gpu,
    )
    critic = cfg.critic
    same_as_actor = (critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz) == (
        actor.ppo_mini_batch_size,
        actor.ppo_micro_batch_size_per_gpu,
        actor.use_dynamic_bsz,
    )
    # A critic that follows the actor's batch sizes would repeat the actor's errors word for word.
    if critic.enable and not (same_as_actor and not critic.use_dynamic_bsz):
        _check_role(
            cfg,
            report,
            "critic",
            critic.ppo_mini_batch_size,
            critic.ppo_micro_batch_size_per_gpu,
            bool(critic.use_dynamic_bsz),
            critic.ppo_max_token_len_per_gpu,
        )
    for role in ("rollout", "ref"):
        sec = getattr(cfg.actor_rollout_ref, role)
        _check_log_prob(
            cfg,
            report,
            f"{ARR}.{role}",
            sec.log_prob_micro_batch_size_per_gpu,
            bool(sec.log_prob_use_dynamic_bsz),
            sec.log_prob_max_token_len_per_gpu,
        )


def _max_seq_len(cfg: RootConfig) -> int:
    rollout = cfg.actor_rollout_ref.rollout
    return (rollout.prompt_length or cfg.data.max_prompt_length) + (
        rollout.response_length or cfg.data.max_response_length
    )


def _check_token_budget(
    cfg: RootConfig, report: IssueCollector, key: str, budget: int | None, dynamic_key: str, micro_key: str
) -> None:
    longest = _max_seq_len(cfg)
    if budget is None or budget < longest:
        report.error(
            key,
            f"dynamic batching needs a token budget per GPU >= the longest sequence, prompt_length + "
            f"response_length = {longest}; got {budget}. Set {key}={longest} (or more), or turn dynamic "
            f"batching off with {dynamic_key}=false and size micro-batches with {micro_key}",
        )


def _check_role(
    cfg: RootConfig,
    report: IssueCollector,
    prefix: str,
    mini: int | None,
    micro: int | None,
    dynamic: bool,
    max_tokens: int | None,
) -> None:
    world = world_size(cfg)
    from verl.config.backend_options import role_data_parallel_size

    dp = role_data_parallel_size(cfg, "critic" if prefix == "critic" else "actor", world)
    # "Per GPU" is per data-parallel rank (verl): the ranks of one model-parallel replica (Megatron) share it.
    if dp == world:
        what, short = "world size trainer.nnodes x trainer.n_gpus_per_node", f"world size ({world})"
    else:
        what = f"data-parallel size ({world} workers / {world // dp} ranks per model replica)"
        short = f"data-parallel size ({dp} = {world} workers / {world // dp} ranks per model replica)"
    world = dp
    n = cfg.actor_rollout_ref.rollout.n
    train = cfg.data.train_batch_size
    mini_key = f"{prefix}.ppo_mini_batch_size"
    micro_key = f"{prefix}.ppo_micro_batch_size_per_gpu"
    if mini is None or mini < 1:
        report.error(mini_key, f"must be >= 1 (prompts per optimizer step), got {mini}")
        return
    if mini > train:
        report.error(mini_key, f"{mini_key} ({mini}) must be <= data.train_batch_size ({train})")
    elif train % mini:
        report.error(
            mini_key,
            f"data.train_batch_size ({train}) must be a multiple of {mini_key} ({mini}): "
            "a training step is split into whole mini-batches",
        )
    sequences = mini * n
    if sequences % world:
        report.error(
            mini_key,
            f"{mini_key} ({mini}) x {ARR}.rollout.n ({n}) = {sequences} sequences must be divisible by the "
            f"{what} = {world}",
        )
        return
    if dynamic:
        _check_token_budget(
            cfg, report, f"{prefix}.ppo_max_token_len_per_gpu", max_tokens, f"{prefix}.use_dynamic_bsz", micro_key
        )
        return
    if micro is None:
        report.error(micro_key, f"must be set when {prefix}.use_dynamic_bsz is false (sequences per micro-batch)")
        return
    if micro < 1:
        report.error(micro_key, f"must be >= 1 (sequences per micro-batch), got {micro}")
        return
    per_gpu = sequences // world
    if per_gpu < micro or per_gpu % micro:
        report.error(
            micro_key,
            f"mini-batch per GPU ({per_gpu}) must be >= and a multiple of micro-batch per GPU ({micro}); "
            f"mini-batch per GPU = {mini_key} ({mini}) x {ARR}.rollout.n ({n}) / {short}. "
            f"Set {micro_key} to a divisor of {per_gpu} or raise {mini_key}",
        )


def _check_log_prob(
    cfg: RootConfig, report: IssueCollector, prefix: str, micro: int | None, dynamic: bool, max_tokens: int | None
) -> None:
    if dynamic:
        _check_token_budget(
            cfg,
            report,
            f"{prefix}.log_prob_max_token_len_per_gpu",
            max_tokens,
            f"{prefix}.log_prob_use_dynamic_bsz",
            f"{prefix}.log_prob_micro_batch_size_per_gpu",
        )
        return
    key = f"{prefix}.log_prob_micro_batch_size_per_gpu"
    if micro is None:
        report.error(key, f"must be set when {prefix}.log_prob_use_dynamic_bsz is false (sequences per forward)")
    elif micro < 1:
        report.error(key, f"must be >= 1 (sequences per forward), got {micro}")
