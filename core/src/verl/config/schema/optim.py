"""Shared sub-sections of actor and critic: optimizer/LR schedule and checkpoint contents."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import fld

LrScheduler = Literal["constant", "cosine"]
# torch.optim classes verl's FSDP optim builds by name (optimizer_impl torch.optim); the others are refused.
OptimizerName = Literal["AdamW", "Adam"]
CheckpointContent = Literal["model", "optimizer", "extra", "hf_model"]


@attrs.frozen(kw_only=True)
class OptimConfig:
    """The optimizer and its LR schedule (verl ``optim``; the critic uses ``lr`` 1e-5).

    Warmup lasts ``lr_warmup_steps`` steps if > 0, else ``lr_warmup_steps_ratio *
    total_training_steps``. The scheduler steps once per training step.

    ``optimizer`` is the ``torch.optim`` class (verl's FSDP ``optim.optimizer`` with ``optimizer_impl:
    torch.optim``): ``AdamW`` (decoupled weight decay) or ``Adam`` (L2 weight decay). ``min_lr`` is
    Megatron's absolute floor of the decay (verl ``McoreOptimizerConfig.min_lr``): the cosine schedule ends
    at ``min_lr`` instead of ``min_lr_ratio * lr`` (setting both is refused); a constant schedule never
    decays, so there it has no effect, as in Megatron (a warning says so).
    """

    optimizer: OptimizerName = fld("AdamW", doc="torch.optim class: AdamW|Adam")
    lr: float = fld(1e-6, doc="peak learning rate")
    betas: tuple[float, float] = fld((0.9, 0.999), doc="AdamW (beta1, beta2)")
    weight_decay: float = fld(0.01, doc="AdamW decoupled weight decay")
    clip_grad: float = fld(1.0, doc="max global grad L2 norm; a non-finite norm skips the step")
    lr_warmup_steps: int = fld(-1, doc="linear warmup length in training steps; <= 0 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = fld(0.0, doc="warmup length as a fraction of total_training_steps")
    lr_scheduler_type: LrScheduler = fld("constant", doc="schedule after warmup: constant|cosine")
    min_lr_ratio: float = fld(0.0, doc="cosine: final lr as a fraction of lr")
    min_lr: float | None = fld(None, doc="cosine: final lr, absolute (Megatron's min_lr); null = min_lr_ratio x lr")
    num_cycles: float = fld(0.5, doc="cosine: number of cosine half-waves x2 (0.5 = decay once)")
    total_training_steps: int = fld(
        -1, doc="schedule length in steps, set by the trainer (as verl's); other values are refused, use trainer.*"
    )


@attrs.frozen(kw_only=True)
class CheckpointConfig:
    """What a training checkpoint holds (verl ``checkpoint``).

    Deviation from verl: only the default, model + optimizer + extra (LR scheduler and counters), is built, which
    exact resume needs; any other selection is refused at load time, and HF weights (``hf_model``) come from
    ``verl export`` of a checkpoint folder. ``strict`` is read by verl only when Megatron saves ``hf_model``
    weights (``megatron_checkpoint_manager``); no checkpoint here holds HF weights, so ``false`` is refused.
    """

    save_contents: tuple[CheckpointContent, ...] = fld(
        ("model", "optimizer", "extra"), doc="parts written per checkpoint: model|optimizer|extra|hf_model"
    )
    load_contents: tuple[CheckpointContent, ...] | None = fld(
        None, doc="parts restored on resume; null = save_contents"
    )
    strict: bool = fld(
        True, doc="strict check of the HF weight export (verl: Megatron's hf_model save only); false is refused"
    )
