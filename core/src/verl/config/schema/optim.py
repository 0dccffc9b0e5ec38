"""Shared sub-sections of actor and critic: optimizer/LR schedule and checkpoint contents."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import fld

LrScheduler = Literal["constant", "cosine"]
CheckpointContent = Literal["model", "optimizer", "extra", "hf_model"]


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW and its LR schedule (verl ``optim``; the critic uses ``lr`` 1e-5).

    Warmup lasts ``lr_warmup_steps`` steps if > 0, else ``lr_warmup_steps_ratio *
    total_training_steps``. The scheduler steps once per training step.
    """

    lr: float = fld(1e-6, doc="peak learning rate")
    betas: tuple[float, float] = fld((0.9, 0.999), doc="AdamW (beta1, beta2)")
    weight_decay: float = fld(0.01, doc="AdamW decoupled weight decay")
    clip_grad: float = fld(1.0, doc="max global grad L2 norm; a non-finite norm skips the step")
    lr_warmup_steps: int = fld(-1, doc="linear warmup length in training steps; <= 0 = use lr_warmup_steps_ratio")
    lr_warmup_steps_ratio: float = fld(0.0, doc="warmup length as a fraction of total_training_steps")
    lr_scheduler_type: LrScheduler = fld("constant", doc="schedule after warmup: constant|cosine")
    min_lr_ratio: float = fld(0.0, doc="cosine: final lr as a fraction of lr")
    num_cycles: float = fld(0.5, doc="cosine: number of cosine half-waves x2 (0.5 = decay once)")
    total_training_steps: int = fld(
        -1, doc="schedule length in steps, set by the trainer (as verl's); other values are refused, use trainer.*"
    )


@attrs.frozen(kw_only=True)
class CheckpointConfig:
    """What a training checkpoint holds (verl ``checkpoint``).

    Deviation from verl: only the default, model + optimizer + extra (LR scheduler and counters), is built, which
    exact resume needs; any other selection is refused at load time, and HF weights (``hf_model``) come from
    ``verl export`` of a checkpoint folder.
    """

    save_contents: tuple[CheckpointContent, ...] = fld(
        ("model", "optimizer", "extra"), doc="parts written per checkpoint: model|optimizer|extra|hf_model"
    )
    load_contents: tuple[CheckpointContent, ...] | None = fld(
        None, doc="parts restored on resume; null = save_contents"
    )
