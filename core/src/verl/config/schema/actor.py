"""``actor_rollout_ref.actor.*`` (policy training) and ``actor_rollout_ref.ref.*`` (reference log-probs)."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import BackendKwargs, fld, free_dict, section
from verl.config.schema.optim import CheckpointConfig, OptimConfig

# verl/trainer/ppo/core_algos.py:agg_loss
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


@attrs.frozen(kw_only=True)
class PolicyLossRolloutCorrectionConfig:
    """``policy_loss.rollout_correction``: read by ``loss_mode=bypass_mode`` only (verl ``RolloutCorrectionConfig``).

    Defaults are those of verl's dataclass, which is what verl's actor gets (no YAML sets them). With
    ``algorithm.rollout_correction.bypass_mode=true`` the loss reads ``algorithm.rollout_correction``
    instead (verl's ``apply_bypass_mode``), so validation refuses values set here then.
    """

    loss_type: Literal["ppo_clip", "reinforce"] = fld(
        "ppo_clip", doc="ppo_clip: PPO clip with r = pi/pi_rollout, no extra weights; reinforce: -w * A * log pi"
    )
    rollout_is: Literal["token", "sequence"] | None = fld(
        "sequence", doc="importance weight w = pi/pi_rollout per token or per sequence; null = none"
    )
    rollout_is_threshold: float | str = fld(
        2.0, doc="w truncated at this upper bound (TIS), or 'lower_upper' zeroes w outside [lower, upper] (IcePop)"
    )
    rollout_is_batch_normalize: bool = fld(
        False, doc="rescale w to mean 1 over each micro-batch (of all ranks together when distributed)"
    )
    rollout_rs: str | None = fld(
        None, doc="rejection sampling modes, comma-separated (as algorithm.rollout_correction.rollout_rs); null = none"
    )
    rollout_rs_threshold: float | str | None = fld(None, doc="rejection threshold per rollout_rs mode")


@attrs.frozen(kw_only=True)
class PolicyLossConfig:
    """Which policy loss to use and the knobs of the clip-cov / kl-cov / dro / bypass variants (verl ``policy_loss``)."""

    loss_mode: str = fld(
        "vanilla",
        doc="registered policy loss: vanilla|dppo_tv|dppo_kl|gspo|sapo|gpg|clip_cov|kl_cov|geo_mean|dro|cispo|bypass_mode",
    )
    clip_cov_ratio: float = fld(0.0002, doc="clip_cov: fraction of tokens whose gradient is dropped")
    clip_cov_lb: float = fld(1.0, doc="clip_cov: lower bound of the covariance window")
    clip_cov_ub: float = fld(5.0, doc="clip_cov: upper bound of the covariance window")
    kl_cov_ratio: float = fld(0.0002, doc="kl_cov: fraction of tokens that get the KL penalty")
    ppo_kl_coef: float = fld(0.1, doc="kl_cov: coefficient of the |logp - logp_old| penalty")
    dro_beta: float | None = fld(None, doc="dro: coefficient of the 0.5 * (logp - logp_old)^2 penalty (> 0, required)")
    rollout_correction: PolicyLossRolloutCorrectionConfig = section(
        PolicyLossRolloutCorrectionConfig, doc="bypass_mode: loss type and importance weights vs the rollout policy"
    )


@attrs.frozen(kw_only=True)
class ActorConfig:
    """PPO/GRPO policy update (verl ``dp_actor.yaml`` / ``ActorConfig``).

    Batch sizes: ``ppo_mini_batch_size`` counts *prompts*; one optimizer step uses
    ``ppo_mini_batch_size * rollout.n`` sequences split over the world size, then into
    micro-batches of ``ppo_micro_batch_size_per_gpu`` sequences (gradient accumulation).

    ``strategy`` null resolves as verl's default where verl's default can run: ``fsdp`` when the world
    (``trainer.nnodes x trainer.n_gpus_per_node``) is larger than one worker, ``reference`` (core's
    single-process PyTorch engine) for one worker; a non-``dp`` ``model_engine`` names the engine instead
    (:mod:`verl.config.resolve`). ``fsdp2`` (verl's name for FSDP2) is accepted as ``fsdp``, which is FSDP2.

    Deviations from verl: ``ppo_micro_batch_size_per_gpu`` defaults to 4 instead of null, so the defaults
    validate without extra keys (verl requires it to be set). ``grad_clip`` is kept for verl's scripts: verl's
    engines clip at ``optim.clip_grad`` and read ``grad_clip`` nowhere, so a value other than
    ``optim.clip_grad`` is refused instead of being ignored.
    """

    strategy: str | None = fld(
        None,
        doc="training engine plugin name: reference|fsdp (verl's fsdp2 = fsdp)|...; null = fsdp when "
        "nnodes x n_gpus_per_node > 1, else reference",
    )
    grad_clip: float | None = fld(
        None, doc="verl's old name of optim.clip_grad; must equal optim.clip_grad when set (verl ignores it)"
    )
    ppo_mini_batch_size: int = fld(256, doc="prompts per optimizer step (x rollout.n sequences)")
    ppo_micro_batch_size_per_gpu: int | None = fld(4, doc="sequences per forward/backward per GPU")
    use_dynamic_bsz: bool = fld(False, doc="form micro-batches by token budget instead of a fixed count")
    ppo_max_token_len_per_gpu: int = fld(16384, doc="dynamic batching: tokens per micro-batch per GPU")
    clip_ratio: float = fld(0.2, doc="PPO clip epsilon (fallback for clip_ratio_low/high)")
    clip_ratio_low: float = fld(0.2, doc="PPO clip: ratio lower bound is 1 - clip_ratio_low")
    clip_ratio_high: float = fld(0.2, doc="PPO clip: ratio upper bound is 1 + clip_ratio_high")
    clip_ratio_c: float = fld(3.0, doc="dual-clip constant for negative advantages (> 1)")
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, doc="policy loss selection and its knobs")
    loss_agg_mode: LossAggMode = fld("token-mean", doc="how token losses reduce to a scalar")
    loss_scale_factor: float | None = fld(
        None, doc="seq-mean-token-sum-norm divisor; null = response width (max_response_length)"
    )
    entropy_coeff: float = fld(0.0, doc="entropy bonus coefficient (loss -= coeff * entropy)")
    use_kl_loss: bool = fld(False, doc="add kl_loss_coef * KL(policy || ref) to the loss (GRPO style)")
    kl_loss_coef: float = fld(0.001, doc="coefficient of the KL loss")
    kl_loss_type: str = fld("low_var_kl", doc="KL estimator for the loss: kl|k1|abs|mse|k2|low_var_kl|k3 (+ suffix)")
    ppo_epochs: int = fld(1, doc="passes over each training batch")
    reuse_on_policy_log_prob: bool = fld(
        True,
        doc="one mini-batch and one epoch: use the update's own detached log-probs as the old policy's "
        "(exact, ratio 1) and skip the separate old_log_prob pass; false always recomputes",
    )
    shuffle: bool = fld(False, doc="shuffle sequences between mini-batches")
    data_loader_seed: int = fld(42, doc="seed of the mini-batch shuffle (+ data-parallel rank)")
    tau_pos: float = fld(1.0, doc="sapo: gate temperature for positive advantages")
    tau_neg: float = fld(1.05, doc="sapo: gate temperature for negative advantages")
    use_torch_compile: bool = fld(
        True, doc="torch.compile the entropy-from-logits function (verl's default; on cpu it compiles for seconds)"
    )
    entropy_from_logits_with_chunking: bool = fld(
        False, doc="compute the entropy over the vocabulary entropy_from_logits_chunk_size tokens at a time"
    )
    entropy_from_logits_chunk_size: int = fld(2048, doc="tokens per chunk of the chunked entropy")
    entropy_checkpointing: bool = fld(False, doc="recompute the entropy in backward instead of keeping its softmax")
    ulysses_sequence_parallel_size: int = fld(
        1, doc="Ulysses sequence-parallel degree; only 1 (verl's default, none) is built, other values are refused"
    )
    optim: OptimConfig = section(OptimConfig, doc="optimizer and LR schedule")
    checkpoint: CheckpointConfig = section(CheckpointConfig, doc="checkpoint contents")
    engine_kwargs: BackendKwargs = free_dict(
        doc="per-strategy engine options, e.g. engine_kwargs.fsdp.param_offload; checked by the plugin's options_cls"
    )

    @entropy_from_logits_chunk_size.validator
    def _check_chunk(self, attribute: attrs.Attribute, value: int) -> None:
        _positive_chunk(attribute, value)


@attrs.frozen(kw_only=True)
class RefConfig:
    """Reference-policy log-prob pass; runs only when a KL term (loss or reward) is on.

    Null values follow the actor (filled in by load_config), like verl's interpolations. ``strategy`` is
    verl's ``ref.strategy`` (``${actor_rollout_ref.actor.strategy}`` there): the reference policy's training
    engine, ``fsdp`` or ``reference`` whatever the actor's (a forward-only engine shares nothing with the
    actor's).
    """

    strategy: str | None = fld(
        None, doc="training engine of the reference policy: reference|fsdp (fsdp2 = fsdp); null = the actor's"
    )
    log_prob_micro_batch_size_per_gpu: int | None = fld(
        None, doc="sequences per forward per GPU; null = actor ppo_micro_batch_size_per_gpu"
    )
    log_prob_use_dynamic_bsz: bool | None = fld(None, doc="token-budget micro-batches; null = actor use_dynamic_bsz")
    log_prob_max_token_len_per_gpu: int | None = fld(
        None, doc="tokens per micro-batch per GPU; null = actor ppo_max_token_len_per_gpu"
    )
    use_torch_compile: bool | None = fld(None, doc="torch.compile its entropy function; null = the actor's value")
    entropy_from_logits_with_chunking: bool = fld(False, doc="chunked entropy (only when entropy is asked for)")
    entropy_from_logits_chunk_size: int = fld(2048, doc="tokens per chunk of the chunked entropy")
    entropy_checkpointing: bool = fld(False, doc="recompute the entropy in backward (forward-only: no effect)")
    ulysses_sequence_parallel_size: int = fld(
        1, doc="Ulysses sequence-parallel degree; only 1 (verl's default, none) is built, other values are refused"
    )
    engine_kwargs: BackendKwargs = free_dict(
        doc="the reference engine's options over the actor's, e.g. engine_kwargs.fsdp.param_offload (= fsdp_config)"
    )

    @entropy_from_logits_chunk_size.validator
    def _check_chunk(self, attribute: attrs.Attribute, value: int) -> None:
        _positive_chunk(attribute, value)


def _positive_chunk(attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        # (message, attribute): the config converter turns this into an error on the key.
        raise ValueError(f"entropy_from_logits_chunk_size must be a token count >= 1, got {value}", attribute, value)
