"""HF model config -> Megatron-core ``TransformerConfig`` / ``GPTModel`` arguments, for the dense decoders we map exactly.

Our own converter (verl's is ``verl/models/mcore/config_converter.py``: ``hf_to_mcore_config_dense``): mbridge
needs Transformer Engine to build a model, so the CPU path cannot use it (``../shared/reference/backends.md``).
Every HF feature we cannot reproduce exactly in Megatron's GPT model is a :class:`ValueError` naming the HF
config field, never silently dropped: a log-prob computed on another function than the rollout's would make
the importance ratios of PPO wrong without any visible error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import attrs
import torch

SUPPORTED = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})
"""HF architectures mapped exactly (SmolLM2 and TinyLlama are ``LlamaForCausalLM``)."""

_BY_MODEL_TYPE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# Megatron fusions that need CUDA kernels (apex / Transformer Engine / triton); every one is off on the cpu.
CPU_OFF_FUSIONS = (
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "gradient_accumulation_fusion",
    "persist_layer_norm",
)

OVERRIDE_KEY = "override_transformer_config"


def _supported() -> str:
    return ", ".join(sorted(SUPPORTED))


def _architecture(hf_config: Any) -> str:
    # A value model saved by a critic (verl's load_valuehead_model: *ForTokenClassification) has the same decoder.
    archs = [
        a.replace("ForTokenClassification", "ForCausalLM") for a in getattr(hf_config, "architectures", None) or []
    ]
    if archs:
        if len(archs) != 1 or archs[0] not in SUPPORTED:
            raise ValueError(
                f"HF config field architectures={archs}: the megatron engine maps exactly one of {_supported()} "
                "(dense decoders; their *ForTokenClassification value models too); use the fsdp or reference engine "
                "for other models"
            )
        return archs[0]
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in _BY_MODEL_TYPE:
        raise ValueError(
            f"HF config has no architectures and model_type={model_type!r}: the megatron engine maps "
            f"{_supported()} (model_type one of {sorted(_BY_MODEL_TYPE)})"
        )
    return _BY_MODEL_TYPE[model_type]


def _rope_theta(hf_config: Any) -> float:
    """RoPE base; transformers 5 keeps it in ``rope_parameters`` (verl: ``megatron_utils.get_hf_rope_theta``)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"HF config field rope_parameters={params!r} is not a mapping")
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(
            f"HF config field rope_parameters is per layer type ({sorted(params)}): the megatron engine maps one "
            "RoPE for all layers"
        )
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(
            f"HF config field rope_parameters (rope_scaling) has rope_type={rope_type!r}: the megatron engine "
            "maps only plain RoPE (rope_type 'default' or no rope_scaling); Megatron's GPT model would compute "
            "other frequencies than HF, so log-probs would not match the rollout"
        )
    factor = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    if factor not in (None, 1.0):
        raise ValueError(f"HF config field partial_rotary_factor={factor}: only 1.0 (full rotary) is mapped")
    theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


def _sliding_window_used(hf_config: Any) -> bool:
    layer_types = getattr(hf_config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return True
    return bool(getattr(hf_config, "use_sliding_window", False) and getattr(hf_config, "sliding_window", None))


@attrs.frozen(kw_only=True)
class ModelShape:
    """What Megatron needs of a HF dense decoder; built by :meth:`from_hf_config`.

    Attributes:
        num_layers: decoder layers (HF ``num_hidden_layers``).
        hidden_size: model width H.
        num_attention_heads: query heads.
        num_query_groups: key/value heads (HF ``num_key_value_heads``; GQA groups).
        head_dim: per-head width (Megatron ``kv_channels``); HF ``head_dim`` or ``hidden_size // heads``.
        ffn_hidden_size: MLP width (HF ``intermediate_size``).
        vocab_size: the real vocabulary V (before padding for tensor parallelism).
        tie_word_embeddings: ``lm_head`` shares the embedding.
        qkv_bias: q/k/v projections have biases (Qwen2).
        qk_layernorm: per-head RMSNorm of q and k before RoPE (Qwen3).
        rms_norm_eps: epsilon of every RMSNorm.
        rope_theta: RoPE base.
        max_position_embeddings: longest sequence RoPE is built for.
        architecture: one of :data:`SUPPORTED`.
        attention_dropout, hidden_dropout: training dropout probabilities (HF ``attention_dropout``; HF dense
            decoders have no hidden dropout, so 0.0 unless the config has ``hidden_dropout``).
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_layernorm: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    architecture: str
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_attention_heads // self.num_query_groups

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> ModelShape:
        """Read a ``transformers`` config of a :data:`SUPPORTED` architecture.

        Raises:
            ValueError: naming the HF config field for anything Megatron's GPT model cannot reproduce exactly:
                another architecture, ``hidden_act`` other than silu, RoPE scaling, partial rotary, MLP biases,
                a Llama/Qwen3 ``attention_bias`` (it also biases ``o_proj``, which Megatron only does together
                with MLP biases), sliding-window attention, heads not divisible by key/value heads.
        """
        arch = _architecture(hf_config)
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"HF config field hidden_act={act!r}: the megatron engine maps only 'silu' (SwiGLU)")
        if getattr(hf_config, "mlp_bias", False):
            raise ValueError("HF config field mlp_bias=True: Megatron's GPT MLP is mapped without biases only")
        if arch != "Qwen2ForCausalLM" and getattr(hf_config, "attention_bias", False):
            raise ValueError(
                f"HF config field attention_bias=True ({arch}): HF then biases o_proj too, which Megatron does "
                "only with add_bias_linear (biases on every linear, MLP included); not mapped exactly"
            )
        if _sliding_window_used(hf_config):
            raise ValueError(
                "HF config fields use_sliding_window / sliding_window / layer_types select sliding-window "
                "attention: the megatron engine maps only full causal attention; set use_sliding_window=false"
            )
        heads = int(hf_config.num_attention_heads)
        groups = int(getattr(hf_config, "num_key_value_heads", None) or heads)
        if heads % groups:
            raise ValueError(
                f"HF config fields num_attention_heads={heads} and num_key_value_heads={groups}: the heads must "
                "split evenly into key/value groups"
            )
        hidden = int(hf_config.hidden_size)
        head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
        return cls(
            num_layers=int(hf_config.num_hidden_layers),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_query_groups=groups,
            head_dim=int(head_dim),
            ffn_hidden_size=int(hf_config.intermediate_size),
            vocab_size=int(hf_config.vocab_size),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM",
            qk_layernorm=arch == "Qwen3ForCausalLM",
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope_theta=_rope_theta(hf_config),
            max_position_embeddings=int(hf_config.max_position_embeddings),
            architecture=arch,
            attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
            hidden_dropout=float(getattr(hf_config, "hidden_dropout", 0.0) or 0.0),
        )


def padded_vocab_size(vocab: int, tp: int) -> int:
    """Smallest multiple of ``tp`` >= ``vocab``: the vocab-parallel embedding/head need equal shards.

    We pad only as much as tensor parallelism needs (Megatron's own trainer pads to a multiple of 128 x tp);
    the padding rows are zero and the engine masks their logits, so log-probs stay exact.
    """
    if vocab < 1 or tp < 1:
        raise ValueError(f"vocab ({vocab}) and tensor_model_parallel_size ({tp}) must be >= 1")
    return -(-vocab // tp) * tp


def _transformer_config_fields() -> set[str]:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return {f.name for f in dataclasses.fields(TransformerConfig) if f.init}


def transformer_config_kwargs(
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    vpp: int | None = None,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    sequence_parallel: bool = False,
    params_dtype: torch.dtype = torch.float32,
    device_type: str = "cpu",
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of megatron-core 0.16 ``TransformerConfig`` for ``shape`` and a parallel layout.

    The layout itself (sizes dividing heads, layers, world) is checked by
    :func:`verl_megatron.parallel.layout_problems`. On the cpu every fusion is off and weights are initialised
    on the cpu (what ``../shared/reference/probes/megatron_cpu_*_probe.py`` measured to work); on an
    accelerator Megatron's fusion defaults stay, plus what verl sets (``masked_softmax_fusion``,
    ``variable_seq_lengths``, the all-to-all MoE dispatcher, ``batch_p2p_comm=False``, ``overlap_p2p_comm``
    with virtual pipeline stages). ``overrides`` (verl's ``override_transformer_config``) go on top: the last
    word, as in verl; an ``attention_backend`` string becomes ``AttnBackend[...]`` as verl does.

    Raises:
        ValueError: an override key that is not a ``TransformerConfig`` field (verl drops those with a
            warning; here it is an error, a misspelt key would otherwise do nothing), or an override turning
            on a CUDA-only fusion (``CPU_OFF_FUSIONS``) on the cpu.
    """
    overrides = dict(overrides or {})
    fields = _transformer_config_fields()
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"{OVERRIDE_KEY} keys {unknown} are not fields of megatron-core's TransformerConfig "
            "(megatron.core.transformer.transformer_config); remove or correct them"
        )
    on_cpu = device_type == "cpu"
    if on_cpu:
        bad = sorted(k for k in CPU_OFF_FUSIONS if overrides.get(k))
        if bad:
            raise ValueError(
                f"{OVERRIDE_KEY}: {bad} need CUDA kernels (apex / Transformer Engine); on the cpu device they "
                "must stay false"
            )
    if "attention_backend" in overrides and isinstance(overrides["attention_backend"], str):
        from megatron.core.transformer.enums import AttnBackend

        overrides["attention_backend"] = AttnBackend[overrides["attention_backend"]]

    kwargs: dict[str, Any] = {
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_query_groups": shape.num_query_groups,
        "kv_channels": shape.head_dim,
        "ffn_hidden_size": shape.ffn_hidden_size,
        "layernorm_epsilon": shape.rms_norm_eps,
        "normalization": "RMSNorm",
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": shape.qkv_bias,
        "qk_layernorm": shape.qk_layernorm,
        # Megatron's defaults are 0.1 for both; HF decoders train with their config's values (0.0).
        "attention_dropout": shape.attention_dropout,
        "hidden_dropout": shape.hidden_dropout,
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "bf16": params_dtype is torch.bfloat16,
        "fp16": params_dtype is torch.float16,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": vpp,
        "context_parallel_size": cp,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": etp,
        "sequence_parallel": sequence_parallel,
        # verl (config_converter._get_base_transformer_config): variable-length micro-batches, no batched p2p
        # (it calls torch.cuda.synchronize), overlapped p2p only with interleaved stages.
        "variable_seq_lengths": True,
        "moe_token_dispatcher_type": "alltoall",
        "batch_p2p_comm": False,
        "overlap_p2p_comm": vpp is not None and vpp > 1,
    }
    if on_cpu:
        kwargs["use_cpu_initialization"] = True
        kwargs.update(dict.fromkeys(CPU_OFF_FUSIONS, False))
    else:
        kwargs["masked_softmax_fusion"] = True
    kwargs.update(overrides)
    return kwargs


def build_transformer_config(shape: ModelShape, **kwargs: Any) -> Any:
    """``TransformerConfig(**transformer_config_kwargs(shape, **kwargs))`` (imports megatron-core)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**transformer_config_kwargs(shape, **kwargs))


def gpt_model_kwargs(shape: ModelShape, padded_vocab: int) -> dict[str, Any]:
    """Keyword arguments of ``GPTModel`` besides config, layer spec and pre/post-process flags.

    ``padded_vocab`` is :func:`padded_vocab_size` of the layout's tensor-parallel size.
    """
    if padded_vocab < shape.vocab_size:
        raise ValueError(f"padded_vocab ({padded_vocab}) is smaller than the model's vocab_size ({shape.vocab_size})")
    return {
        "vocab_size": padded_vocab,
        "max_sequence_length": shape.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": shape.rope_theta,
        "share_embeddings_and_output_weights": shape.tie_word_embeddings,
    }


def layer_spec(shape: ModelShape, impl: str) -> Any:
    """Megatron's GPT layer spec: ``"local"`` (pure megatron-core, runs on cpu) or ``"transformer_engine"``.

    Raises:
        ValueError: ``impl`` is neither (the engine resolves ``transformer_impl=auto`` before calling).
        ImportError: ``"transformer_engine"`` without Transformer Engine installed.
    """
    from megatron.core.models.gpt import gpt_layer_specs

    if impl == "local":
        return gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=shape.qk_layernorm)
    if impl == "transformer_engine":
        import transformer_engine  # noqa: F401  (a clear ImportError here rather than deep inside megatron)

        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=shape.qk_layernorm)
    raise ValueError(f"transformer_impl={impl!r}: choose 'local' or 'transformer_engine'")
