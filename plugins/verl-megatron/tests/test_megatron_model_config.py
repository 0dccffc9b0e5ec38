"""HF config -> Megatron config (verl_megatron.model_config), checked against a real megatron-core GPTModel on cpu.

The GPTModel tests run in this process on a 1-rank gloo group (TP=1) with the plugin's own cpu shims
(verl_megatron.cpu_compat), entered and undone by a fixture.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
from verl_megatron import cpu_compat
from verl_megatron.model_config import (
    CPU_OFF_FUSIONS,
    ModelShape,
    build_transformer_config,
    gpt_model_kwargs,
    layer_spec,
    padded_vocab_size,
    transformer_config_kwargs,
)
from verl_megatron.weights import megatron_shard_from_hf, megatron_state_dict_names


def cfg(cls=LlamaConfig, **kw):
    base = dict(
        vocab_size=103,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return cls(**{**base, **kw})


CONFIGS = {"llama": (LlamaConfig, {}), "qwen2": (Qwen2Config, {}), "qwen3": (Qwen3Config, {"head_dim": 16})}


def tiny(arch, *, vocab=103, tied=False, **kw):
    """A random tiny HF model, every parameter (biases, norms) perturbed (as in test_megatron_weights.py)."""
    cls, extra = CONFIGS[arch]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        cfg(cls, vocab_size=vocab, tie_word_embeddings=tied, **extra, **kw)
    ).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def test_shape_from_hf_configs():
    llama = ModelShape.from_hf_config(cfg(LlamaConfig, rope_theta=5e5, rms_norm_eps=1e-5, attention_dropout=0.1))
    assert (llama.architecture, llama.head_dim, llama.num_query_groups, llama.heads_per_group) == (
        "LlamaForCausalLM",
        8,
        2,
        2,
    )
    assert (llama.qkv_bias, llama.qk_layernorm, llama.rope_theta, llama.rms_norm_eps) == (False, False, 5e5, 1e-5)
    assert (llama.attention_dropout, llama.hidden_dropout, llama.vocab_size, llama.ffn_hidden_size) == (
        0.1,
        0.0,
        103,
        64,
    )
    qwen2 = ModelShape.from_hf_config(cfg(Qwen2Config, tie_word_embeddings=True))
    assert (qwen2.qkv_bias, qwen2.qk_layernorm, qwen2.tie_word_embeddings, qwen2.head_dim) == (True, False, True, 8)
    qwen3 = ModelShape.from_hf_config(cfg(Qwen3Config, head_dim=16, rope_theta=1e6))
    assert (qwen3.qkv_bias, qwen3.qk_layernorm, qwen3.head_dim, qwen3.rope_theta) == (False, True, 16, 1e6)
    # no architectures recorded: model_type decides
    bare = cfg(Qwen2Config)
    bare.architectures = None
    assert ModelShape.from_hf_config(bare).architecture == "Qwen2ForCausalLM"


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (cfg(LlamaConfig, hidden_act="gelu"), "hidden_act='gelu'"),
        (cfg(LlamaConfig, mlp_bias=True), "mlp_bias"),
        (cfg(LlamaConfig, attention_bias=True), "attention_bias=True.*o_proj"),
        (cfg(Qwen3Config, attention_bias=True), "attention_bias=True"),
        (
            cfg(
                LlamaConfig,
                max_position_embeddings=16384,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            ),
            "rope_type='llama3'",
        ),
        (cfg(Qwen2Config, use_sliding_window=True, sliding_window=16, max_window_layers=1), "sliding"),
        (
            cfg(LlamaConfig, architectures=["MistralForCausalLM"]),
            r"architectures=\['MistralForCausalLM'\].*Qwen3ForCausalLM",
        ),
        (cfg(LlamaConfig, num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads=3"),
    ],
)
def test_unmappable_configs_are_rejected(config, match):
    with pytest.raises(ValueError, match=match):
        ModelShape.from_hf_config(config)


def test_padded_vocab_size():
    assert [padded_vocab_size(103, t) for t in (1, 2, 4, 8)] == [103, 104, 104, 104]
    assert padded_vocab_size(104, 2) == 104
    with pytest.raises(ValueError):
        padded_vocab_size(103, 0)


def test_transformer_config_kwargs_cpu_and_cuda():
    shape = ModelShape.from_hf_config(cfg(Qwen2Config))
    cpu = transformer_config_kwargs(shape, tp=2, params_dtype=torch.bfloat16, device_type="cpu")
    assert all(cpu[k] is False for k in CPU_OFF_FUSIONS)
    assert cpu["use_cpu_initialization"] and cpu["bf16"] and not cpu["fp16"]
    assert cpu["params_dtype"] is cpu["pipeline_dtype"] is torch.bfloat16
    assert (cpu["add_qkv_bias"], cpu["add_bias_linear"], cpu["kv_channels"], cpu["num_query_groups"]) == (
        True,
        False,
        8,
        2,
    )
    assert (cpu["hidden_dropout"], cpu["attention_dropout"], cpu["batch_p2p_comm"], cpu["variable_seq_lengths"]) == (
        0.0,
        0.0,
        False,
        True,
    )
    cuda = transformer_config_kwargs(
        shape,
        tp=2,
        pp=2,
        vpp=2,
        device_type="cuda",
        overrides={
            "attention_backend": "flash",
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        },
    )
    assert cuda["masked_softmax_fusion"] is True and "use_cpu_initialization" not in cuda
    assert "apply_rope_fusion" not in cuda  # megatron's default stays on accelerators
    assert cuda["overlap_p2p_comm"] is True and cuda["recompute_granularity"] == "full"
    from megatron.core.transformer.enums import AttnBackend

    assert cuda["attention_backend"] is AttnBackend.flash
    # overrides are the last word
    assert transformer_config_kwargs(shape, overrides={"hidden_dropout": 0.2})["hidden_dropout"] == 0.2
    with pytest.raises(ValueError, match=r"override_transformer_config keys \['no_such_key'\]"):
        transformer_config_kwargs(shape, overrides={"no_such_key": 1})
    with pytest.raises(ValueError, match="apply_rope_fusion"):
        transformer_config_kwargs(shape, device_type="cpu", overrides={"apply_rope_fusion": True})


def test_build_transformer_config_and_model_kwargs():
    shape = ModelShape.from_hf_config(cfg(Qwen3Config, head_dim=16, tie_word_embeddings=True, rope_theta=1e6))
    tc = build_transformer_config(shape, params_dtype=torch.float32)
    assert (tc.kv_channels, tc.qk_layernorm, tc.num_query_groups, tc.normalization) == (16, True, 2, "RMSNorm")
    assert tc.activation_func is torch.nn.functional.silu and tc.gated_linear_unit
    kw = gpt_model_kwargs(shape, padded_vocab_size(103, 2))
    assert kw == {
        "vocab_size": 104,
        "max_sequence_length": 64,
        "position_embedding_type": "rope",
        "rotary_base": 1000000.0,
        "share_embeddings_and_output_weights": True,
    }
    with pytest.raises(ValueError, match="padded_vocab"):
        gpt_model_kwargs(shape, 100)
    with pytest.raises(ValueError, match="transformer_impl='te'"):
        layer_spec(shape, "te")


@pytest.fixture(scope="module")
def megatron_tp1(tmp_path_factory):
    """A 1-rank gloo group with Megatron's parallel state (TP=PP=1) and the plugin's cpu shims, torn down after."""
    from megatron.core import parallel_state as ps

    own_group = not dist.is_initialized()
    if own_group:
        store = tmp_path_factory.mktemp("gloo") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    with cpu_compat.current_device_is_cpu():
        ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
        cpu_compat.init_rng_tracker(0, on_cpu=True)
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        if own_group:
            dist.destroy_process_group()


def build_gpt(shape, *, pre=True, post=True, vocab=None):
    from megatron.core.models.gpt import GPTModel

    tc = build_transformer_config(shape, params_dtype=torch.float32, device_type="cpu")
    with cpu_compat.current_device_is_cpu():  # RoPE's inv_freq is made on torch.cuda.current_device()
        return GPTModel(
            config=tc,
            transformer_layer_spec=layer_spec(shape, "local"),
            pre_process=pre,
            post_process=post,
            **gpt_model_kwargs(shape, vocab or shape.vocab_size),
        )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(("pre", "post"), [(True, True), (True, False), (False, True)])
def test_names_and_shapes_match_a_real_gpt_model(megatron_tp1, arch, tied, pre, post):
    model = tiny(arch, vocab=103, tied=tied)
    shape = ModelShape.from_hf_config(model.config)
    gpt = build_gpt(shape, pre=pre, post=post)
    real = {k: v for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
    ours = megatron_state_dict_names(shape, num_local_layers=2, first_stage=pre, last_stage=post)
    assert list(real) == ours
    shard = megatron_shard_from_hf(
        model.state_dict(), list(real), shape, tp_size=1, tp_rank=0, layer_offset=0, padded_vocab=103
    )
    assert {k: tuple(v.shape) for k, v in shard.items()} == {k: tuple(v.shape) for k, v in real.items()}


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_forward_equals_hf_logits(megatron_tp1, arch, tied):
    model = tiny(arch, vocab=103, tied=tied, rope_theta=500.0).eval()  # a non-default base: rotary_base is used
    model.config._attn_implementation = "eager"
    shape = ModelShape.from_hf_config(model.config)
    gpt = build_gpt(shape).eval()
    names = [k for k in gpt.state_dict() if not k.endswith("_extra_state")]
    shard = megatron_shard_from_hf(
        model.state_dict(), names, shape, tp_size=1, tp_rank=0, layer_offset=0, padded_vocab=103
    )
    result = gpt.load_state_dict(shard, strict=False)
    assert not result.unexpected_keys and all(k.endswith("_extra_state") for k in result.missing_keys)
    s = 12
    ids = torch.randint(0, 103, (2, s), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(s).unsqueeze(0).expand(2, -1)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    with torch.no_grad(), cpu_compat.current_device_is_cpu():
        logits = gpt(ids, pos, mask)
        ref = model(input_ids=ids, position_ids=pos).logits
    assert logits.shape == ref.shape
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)


def test_cpu_shim_is_undone_outside_its_blocks(megatron_tp1):
    assert torch.cuda.current_device.__name__ == "current_device"  # torch's own, not the plugin's "cpu"


def test_config_fields_exist_in_megatron():
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    shape = ModelShape.from_hf_config(cfg())
    assert set(transformer_config_kwargs(shape, device_type="cuda")) <= fields
