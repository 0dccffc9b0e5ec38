"""``trainer.*`` (the RL loop, logging, checkpoints, placement) and ``ray_kwargs.*``."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import FreeDict, fld, free_dict

# verl's trainer.logger names (verl/utils/tracking.py:Tracking.supported_backend, plus its deprecated
# "tracking"). The shipped ones work as in verl; the rest are rejected by TrainerConfig with the reason.
Logger = Literal[
    "console",
    "tensorboard",
    "file",
    "wandb",
    "mlflow",
    "swanlab",
    "clearml",
    "vemlp_wandb",
    "trackio",
    "rl_insight",
    "tracking",
]
UNSHIPPED_LOGGERS: dict[str, str] = {
    "vemlp_wandb": "Volcengine ML Platform's hosted wandb needs its SDK (volcengine_ml_platform) and Volcengine "
    "credentials; use wandb",
    "trackio": "use wandb, mlflow, swanlab, clearml, tensorboard or file",
    "rl_insight": "rl-insight runtime signals (VERL_RL_INSIGHT_ENABLE); use the other loggers",
    "tracking": "verl's deprecated alias of wandb; write wandb",
}
ResumeMode = Literal["auto", "disable", "resume_path"]
Controller = Literal["local", "ray"]
# verl's switch between its legacy fsdp_workers and the engine workers (removed from verl's config since):
# auto/disable = the engine workers, the only implementation here; enable is refused.
LegacyWorkerImpl = Literal["auto", "enable", "disable"]


def unshipped_logger_message(name: str) -> str:
    """Why the verl logger ``name`` (a key of :data:`UNSHIPPED_LOGGERS`) is refused, and what to use."""
    return f"{name!r} is a verl logger not shipped here: {UNSHIPPED_LOGGERS[name]}"


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """Loop length, logging, checkpointing and worker placement.

    World size = ``nnodes * n_gpus_per_node`` workers (CPU processes on a CPU machine).

    Deviations from verl: ``n_gpus_per_node`` 1 (verl 8), ``logger`` ``[console]`` (verl adds
    wandb, an optional extra here: ``pip install './core[wandb]'``), ``device`` null = auto-detect via platform probes (verl
    ``cuda``), ``default_local_dir`` null = ``checkpoints/<project_name>/<experiment_name>``
    (verl's interpolation, filled in by load_config). New keys: ``controller`` (``local`` =
    in-process worker group, world size 1; ``ray`` = Ray actors; null = ``ray`` as verl whenever the run
    needs more than one process, i.e. a world larger than one worker or a rollout pool of its own, else
    ``local``), ``seed`` and ``max_nonfinite_steps`` (docs/reliability.md). ``use_legacy_worker_impl`` is
    accepted for verl's scripts: ``auto``/``disable`` select the engine-based workers, the only ones here
    (and in verl today); ``enable`` (verl's removed ``fsdp_workers``) is refused.
    """

    total_epochs: int = fld(30, doc="passes over the training set")
    total_training_steps: int | None = fld(None, doc="stop after this many steps; null = epochs x batches")
    project_name: str = fld("verl_examples", doc="project name (run directory and loggers)")
    experiment_name: str = fld("gsm8k", doc="experiment name (run directory and loggers)")
    logger: tuple[Logger, ...] = fld(
        ("console",),
        doc="metric sinks: console|file|tensorboard|wandb|mlflow|swanlab|clearml (wandb..clearml: extras)",
    )
    log_val_generations: int = fld(0, doc="validation samples (prompt, response, score) to log")
    nnodes: int = fld(1, doc="number of nodes")
    n_gpus_per_node: int = fld(1, doc="workers per node (GPUs, or processes on CPU)")
    save_freq: int = fld(-1, doc="checkpoint every N steps; <= 0 = only when asked")
    test_freq: int = fld(-1, doc="validate every N steps; <= 0 = never during training")
    resume_mode: ResumeMode = fld("auto", doc="auto: latest checkpoint if any; disable; resume_path")
    resume_from_path: str | None = fld(None, doc="checkpoint folder (global_step_N) for resume_mode=resume_path")
    val_before_train: bool = fld(True, doc="validate once before the first step")
    val_only: bool = fld(
        False,
        doc="validate the loaded (or resumed) policy once, as the step-0 validation, and exit without training "
        "(verl: only inside val_before_train)",
    )
    critic_warmup: int = fld(0, doc="steps that train only the critic")
    default_local_dir: str | None = fld(None, doc="checkpoint root; null = checkpoints/<project>/<experiment>")
    max_actor_ckpt_to_keep: int | None = fld(
        None,
        doc="keep the N newest checkpoints, plus the newest healthy one (finite weights, not every update skipped) "
        "when none of those is healthy (docs/reliability.md); null = all",
    )
    max_critic_ckpt_to_keep: int | None = fld(
        None, doc="keep the critic part in at most the newest N checkpoints; null = all"
    )
    device: str | None = fld(None, doc="platform name (cpu|cuda|npu|...); null = auto-detect")
    controller: Controller | None = fld(
        None,
        doc="local: in-process workers (world size 1); ray: Ray actors; null = ray when nnodes x n_gpus_per_node "
        "> 1 or the rollout has processes of its own, else local",
    )
    use_legacy_worker_impl: LegacyWorkerImpl = fld(
        "auto", doc="verl's worker switch: auto|disable = engine workers (the only ones here); enable is refused"
    )
    seed: int = fld(42, doc="global seed of torch/numpy/random in every worker")
    validation_data_dir: str | None = fld(None, doc="dump validation generations (jsonl) here; null = off")
    rollout_data_dir: str | None = fld(None, doc="dump training rollouts (jsonl) here; null = off")
    balance_batch: bool = fld(True, doc="reorder sequences so data-parallel ranks get equal token counts")
    max_nonfinite_steps: int | None = fld(
        5,
        doc="stop the run (after a checkpoint) when more than this many consecutive optimizer steps were skipped "
        "for a non-finite grad norm (actor/skipped_steps), or when it reaches its last step without applying one; "
        "null = never stop",
    )

    @logger.validator
    def _check_logger(self, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
        for name in value:
            if name in UNSHIPPED_LOGGERS:
                # (message, attribute): the config converter turns this into an error on trainer.logger.
                raise ValueError(unshipped_logger_message(name), attribute, value)


@attrs.frozen(kw_only=True)
class RayKwargsConfig:
    """Options for Ray (``controller: ray`` only)."""

    ray_init: FreeDict = free_dict(doc="kwargs for ray.init, e.g. {num_cpus: 4, object_store_memory: 268435456}")
