"""``critic.*``: the value model trained for GAE (verl ``critic.yaml``)."""

from __future__ import annotations

import attrs

from verl.config.schema._fields import BackendKwargs, fld, free_dict, section
from verl.config.schema.actor import LossAggMode
from verl.config.schema.model import CriticModelConfig
from verl.config.schema.optim import CheckpointConfig, OptimConfig


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)


@attrs.frozen(kw_only=True)
class CriticConfig:
    """Value-model training. Null values follow the actor (filled in by load_config).

    ``enable`` null = on exactly when ``algorithm.adv_estimator`` is ``gae`` (verl's
    ``need_critic``). Batch sizes count prompts like the actor's.
    """

    enable: bool | None = fld(None, doc="train a critic; null = only when algorithm.adv_estimator is gae")
    strategy: str | None = fld(None, doc="training engine plugin name; null = actor strategy")
    model: CriticModelConfig = section(CriticModelConfig, doc="value model to load")
    ppo_mini_batch_size: int | None = fld(None, doc="prompts per optimizer step; null = actor's")
    ppo_micro_batch_size_per_gpu: int | None = fld(None, doc="sequences per forward/backward per GPU; null = actor's")
    use_dynamic_bsz: bool | None = fld(None, doc="token-budget micro-batches; null = actor's")
    ppo_max_token_len_per_gpu: int = fld(32768, doc="dynamic batching: tokens per micro-batch per GPU")
    ulysses_sequence_parallel_size: int = fld(
        1, doc="Ulysses sequence-parallel degree; only 1 (verl's default, none) is built, other values are refused"
    )
    ppo_epochs: int | None = fld(None, doc="passes over each training batch; null = actor's")
    shuffle: bool | None = fld(None, doc="shuffle sequences between mini-batches; null = actor's")
    cliprange_value: float = fld(0.5, doc="value clip: new values stay within old +- cliprange_value")
    loss_agg_mode: LossAggMode | None = fld(None, doc="how token value losses reduce; null = actor's")
    optim: OptimConfig = fld(factory=_critic_optim, doc="optimizer and LR schedule (lr 1e-5)")
    checkpoint: CheckpointConfig = section(CheckpointConfig, doc="checkpoint contents")
    engine_kwargs: BackendKwargs = free_dict(doc="per-strategy engine options for the critic, e.g. engine_kwargs.fsdp")
