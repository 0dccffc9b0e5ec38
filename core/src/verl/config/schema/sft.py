"""The SFT trainer's config tree (verl ``sft_trainer_engine.yaml``, plus the legacy ``sft_trainer.yaml``'s
single-turn ``data.prompt_key`` / ``data.response_key``).

Loaded by :func:`verl.config.sft_loader.load_sft_config`: unknown keys are refused with a did-you-mean, and the
keys verl has but this trainer cannot honour are refused there with the reason (never accepted and ignored).
"""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import FreeDict, fld, free_dict, section
from verl.config.schema.optim import CheckpointConfig, OptimConfig
from verl.config.schema.trainer import Logger, ResumeMode

SFTTruncation = Literal["error", "left", "right"]
PadMode = Literal["no_padding", "right"]
ModelDtype = Literal["fp32", "bf16", "fp16"]
FileList = tuple[str, ...] | None


@attrs.frozen(kw_only=True)
class SFTDataConfig:
    """SFT rows, their token budget and the batch sizes (verl ``sft_trainer_engine.yaml`` ``data``).

    A row is multi-turn (``messages_key``: a list of ``{role, content}``; loss on every assistant turn) unless
    both ``prompt_key`` and ``response_key`` are set: then it is single-turn (a prompt string or message list,
    and the response string; loss on the response). ``train_batch_size`` rows make one optimizer step.
    """

    train_files: FileList = fld(None, doc="training parquet/jsonl file(s)")
    val_files: FileList = fld(None, doc="validation parquet/jsonl file(s); null = no val/loss")
    train_max_samples: int = fld(-1, doc="use the first N training rows; -1 = all")
    val_max_samples: int = fld(-1, doc="use the first N validation rows; -1 = all")
    messages_key: str = fld("messages", doc="column of the chat messages (multi-turn rows)")
    prompt_key: str | None = fld(None, doc="single-turn rows: column of the prompt (string or messages)")
    response_key: str | None = fld(None, doc="single-turn rows: column of the response string")
    max_length: int = fld(1024, doc="tokens per row (prompt + response); longer rows follow truncation")
    truncation: SFTTruncation = fld("error", doc="a row longer than max_length: error|left|right")
    pad_mode: PadMode = fld(
        "no_padding", doc="no_padding: rows padded to the batch's longest only; right: padded to max_length"
    )
    train_batch_size: int = fld(256, doc="rows per optimizer step")
    micro_batch_size_per_gpu: int = fld(4, doc="rows per forward/backward (and per validation forward)")
    use_dynamic_bsz: bool = fld(True, doc="plan micro-batches by max_token_len_per_gpu instead of row counts")
    max_token_len_per_gpu: int = fld(8192, doc="token budget of one micro-batch with use_dynamic_bsz")
    apply_chat_template_kwargs: FreeDict = free_dict(doc="extra kwargs of tokenizer.apply_chat_template")
    shuffle: bool = fld(True, doc="shuffle the training rows every epoch (seeded by trainer.seed)")


@attrs.frozen(kw_only=True)
class SFTModelConfig:
    """The model to fine-tune (verl ``model/hf_model.yaml``)."""

    path: str = fld("smollm2-135m-instruct", doc="HF folder, cached hub id, or a verl.models alias")
    tokenizer_path: str | None = fld(None, doc="tokenizer folder/id; null = path")
    trust_remote_code: bool = fld(False, doc="allow model/tokenizer code from the model repository")
    use_remove_padding: bool = fld(True, doc="pack each micro-batch's real tokens into one row (no padding cost)")
    enable_gradient_checkpointing: bool = fld(True, doc="recompute activations in backward to save memory")
    override_config: FreeDict = free_dict(doc="HF model config values set before the weights load")
    enable_activation_offload: bool = fld(
        False, doc="keep saved activations in host memory until backward (accelerators; as the RL actor's key)"
    )
    lora_rank: int = fld(0, doc="LoRA rank r (peft); 0 = full fine-tuning (docs/lora.md)")
    lora_alpha: int | float = fld(16, doc="LoRA scaling numerator: the update is (lora_alpha / lora_rank) * B @ A")
    target_modules: str | tuple[str, ...] = fld(
        "all-linear", doc="modules that get adapters: all-linear, one regex, or a list of names"
    )
    exclude_modules: str | tuple[str, ...] | None = fld(None, doc="module names or one regex never adapted")
    lora_adapter_path: str | None = fld(None, doc="a peft adapter folder to continue from (needs lora_rank > 0)")


@attrs.frozen(kw_only=True)
class SFTEngineConfig:
    """The training engine (verl ``engine/*.yaml``: ``strategy`` names it)."""

    strategy: str = fld(
        "reference", doc="training engine (a plugin name): reference (one process), fsdp|fsdp2, megatron (ranks)"
    )
    model_dtype: ModelDtype | None = fld(
        None, doc="parameter dtype of the reference and fsdp engines: fp32|bf16|fp16; null = fp32 (verl's)"
    )
    options: FreeDict = free_dict(
        doc="verl's other engine/<strategy>.yaml keys, written flat as engine.<key> (param_offload, fsdp_size, "
        "tensor_model_parallel_size, ...): the engine's options, checked by its plugin as the RL actor's "
        "fsdp_config / megatron section"
    )


@attrs.frozen(kw_only=True)
class SFTTrainerConfig:
    """Loop length, logging, checkpoints (verl ``sft_trainer_engine.yaml`` ``trainer``).

    Deviations from verl: ``logger`` ``[console]`` (verl adds wandb), ``device`` ``cpu`` (verl ``cuda``),
    ``default_local_dir`` null = ``checkpoints/<project_name>/<experiment_name>`` (verl's interpolation).
    """

    default_local_dir: str | None = fld(None, doc="run folder; null = checkpoints/<project>/<experiment>")
    project_name: str = fld("gsm8k-sft", doc="project name (run folder and loggers)")
    experiment_name: str = fld("test", doc="experiment name (run folder and loggers)")
    total_epochs: int = fld(4, doc="passes over the training rows")
    total_training_steps: int | None = fld(None, doc="stop after this many steps; null = epochs x batches")
    logger: tuple[Logger, ...] = fld(("console",), doc="metric sinks: console|file|tensorboard|wandb|...")
    seed: int = fld(1, doc="seed of the shuffle and of torch")
    save_freq: int = fld(-1, doc="checkpoint every N steps (and at the last step); <= 0 = last step only")
    test_freq: int = fld(-1, doc="val/loss every N steps (and at the last step); <= 0 = last step only")
    max_ckpt_to_keep: int | None = fld(None, doc="keep at most N checkpoints; null = all")
    resume_mode: ResumeMode = fld("auto", doc="auto: latest checkpoint if any; disable; resume_path")
    resume_from_path: str | None = fld(None, doc="checkpoint folder (global_step_N) for resume_mode=resume_path")
    device: str = fld("cpu", doc="torch device type: cpu|cuda")
    nnodes: int = fld(1, doc="nodes of a torchrun launch (verl sft launches one node itself; more: torchrun)")
    n_gpus_per_node: int = fld(
        1, doc="processes per node: verl sft starts them itself (rendezvous on loopback); under torchrun 1 or its own"
    )


@attrs.frozen(kw_only=True)
class SFTConfig:
    """A whole SFT run (``verl sft CONFIG k=v``, ``python -m verl.trainer.sft_trainer``)."""

    data: SFTDataConfig = section(SFTDataConfig, doc="rows, lengths and batch sizes")
    model: SFTModelConfig = section(SFTModelConfig, doc="the model to fine-tune")
    engine: SFTEngineConfig = section(SFTEngineConfig, doc="training engine")
    optim: OptimConfig = attrs.field(
        factory=lambda: OptimConfig(lr=1e-3),
        metadata={"doc": "optimizer and LR schedule (verl optim/fsdp.yaml: lr 1e-3)"},
    )
    checkpoint: CheckpointConfig = section(CheckpointConfig, doc="checkpoint contents")
    trainer: SFTTrainerConfig = section(SFTTrainerConfig, doc="loop, logging, checkpoints")
