"""HF <-> Megatron TP-shard weight mapping (verl_megatron.weights): pure tensors, no megatron, no process group."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from verl_megatron.model_config import ModelShape, padded_vocab_size
from verl_megatron.weights import (
    hf_from_gathered,
    hf_names_for,
    hf_pieces_from_shard,
    hf_state_dict_order,
    load_hf_shard,
    megatron_shard_from_hf,
    megatron_state_dict_names,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 16}),  # head_dim != hidden/heads: kv_channels used
}


def tiny(arch: str, *, vocab: int = 104, tied: bool = False, kv: int = 2, seed: int = 0):
    """A random tiny HF model; every parameter (biases and norms too) perturbed so that no mapping hides."""
    cfg_cls, model_cls, extra = ARCHS[arch]
    cfg = cfg_cls(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        **extra,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def stage_names(shape: ModelShape, pp: int, stage: int, impl: str = "local") -> tuple[list[str], int]:
    n = shape.num_layers // pp
    names = megatron_state_dict_names(
        shape, num_local_layers=n, first_stage=stage == 0, last_stage=stage == pp - 1, impl=impl
    )
    return names, stage * n


def shards(sd, shape, names, tp, offset, vp):
    return [
        megatron_shard_from_hf(sd, names, shape, tp_size=tp, tp_rank=r, layer_offset=offset, padded_vocab=vp)
        for r in range(tp)
    ]


CASES = [
    (arch, vocab, tied, tp, kv)
    for arch in ARCHS
    for vocab in (104, 103)
    for tied in (False, True)
    for tp, kv in ((1, 2), (2, 2), (4, 4))
]


@pytest.mark.parametrize(("arch", "vocab", "tied", "tp", "kv"), CASES)
@pytest.mark.parametrize("pp", [1, 2])
def test_round_trip_exact(arch, vocab, tied, tp, kv, pp):
    model = tiny(arch, vocab=vocab, tied=tied, kv=kv)
    sd = model.state_dict()
    shape = ModelShape.from_hf_config(model.config)
    vp = padded_vocab_size(vocab, tp)
    seen = {}
    for stage in range(pp):
        names, offset = stage_names(shape, pp, stage, impl="local" if stage == 0 else "transformer_engine")
        per_rank = shards(sd, shape, names, tp, offset, vp)
        for name in names:
            for hf_name, full in hf_from_gathered(
                name, [s[name] for s in per_rank], shape, layer_offset=offset, padded_vocab=vp
            ):
                assert torch.equal(full, sd[hf_name]), (name, hf_name)
                seen[hf_name] = full
    expected = set(hf_state_dict_order(shape, include_tied_lm_head=pp > 1))
    assert set(seen) == expected


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_shard_layout_matches_an_independent_construction(arch, tp):
    """QKV per group [q heads of g; k_g; v_g], fc1 [gate_r; up_r], row-parallel columns, zero vocab padding."""
    model = tiny(arch, vocab=103)
    sd = model.state_dict()
    shape = ModelShape.from_hf_config(model.config)
    vp = padded_vocab_size(103, tp)
    names, _ = stage_names(shape, 1, 0)
    hd, qpg, groups = shape.head_dim, 2, 2
    for r, shard in enumerate(shards(sd, shape, names, tp, 0, vp)):
        p = "model.layers.1.self_attn."
        rows = []
        for g in range(r * groups // tp, (r + 1) * groups // tp):
            for h in range(g * qpg, (g + 1) * qpg):
                rows.append(sd[p + "q_proj.weight"][h * hd : (h + 1) * hd])
            rows.append(sd[p + "k_proj.weight"][g * hd : (g + 1) * hd])
            rows.append(sd[p + "v_proj.weight"][g * hd : (g + 1) * hd])
        assert torch.equal(shard["decoder.layers.1.self_attention.linear_qkv.weight"], torch.cat(rows))
        f = 64 // tp
        fc1 = torch.cat(
            [
                sd["model.layers.1.mlp.gate_proj.weight"][r * f : (r + 1) * f],
                sd["model.layers.1.mlp.up_proj.weight"][r * f : (r + 1) * f],
            ]
        )
        assert torch.equal(shard["decoder.layers.1.mlp.linear_fc1.weight"], fc1)
        c = shape.num_attention_heads * hd // tp
        assert torch.equal(
            shard["decoder.layers.1.self_attention.linear_proj.weight"], sd[p + "o_proj.weight"][:, r * c : (r + 1) * c]
        )
        emb = shard["embedding.word_embeddings.weight"]
        assert emb.shape == (vp // tp, 32)
        lo, hi = r * vp // tp, min((r + 1) * vp // tp, 103)
        assert torch.equal(emb[: hi - lo], sd["model.embed_tokens.weight"][lo:hi])
        assert not emb[hi - lo :].any()  # padding rows are zero
        assert torch.equal(shard["output_layer.weight"][: hi - lo], sd["lm_head.weight"][lo:hi])


@pytest.mark.parametrize(("arch", "tp"), [("qwen2", 2), ("qwen3", 2), ("llama", 4)])
def test_pieces_cat_to_the_full_tensor(arch, tp):
    model = tiny(arch, vocab=103, kv=4 if tp == 4 else 2)
    sd = model.state_dict()
    shape = ModelShape.from_hf_config(model.config)
    vp = padded_vocab_size(103, tp)
    names, _ = stage_names(shape, 1, 0)
    collected: dict[str, list] = {}
    for r, shard in enumerate(shards(sd, shape, names, tp, 0, vp)):
        for name in names:
            for hf_name, local, dim, start, stop in hf_pieces_from_shard(
                name, shard[name], shape, tp_size=tp, tp_rank=r, layer_offset=0, padded_vocab=vp
            ):
                full = sd[hf_name]
                if dim is None:
                    assert (start, stop) == (0, full.shape[0])
                    assert torch.equal(local, full)
                else:
                    assert torch.equal(local, full.narrow(dim, start, stop - start)), (hf_name, r)
                collected.setdefault(hf_name, []).append((start, local, dim))
    vocab_last = collected["model.embed_tokens.weight"][-1][1]
    assert vocab_last.shape[0] == 103 - (tp - 1) * (vp // tp)  # the last rank's piece is clipped
    for hf_name, parts in collected.items():
        dim = parts[0][2]
        if dim is not None:
            assert torch.equal(torch.cat([t for _, t, _ in sorted(parts, key=lambda x: x[0])], dim), sd[hf_name])


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("tied", [False, True])
def test_hf_state_dict_order_is_the_models(arch, tied):
    model = tiny(arch, tied=tied)
    shape = ModelShape.from_hf_config(model.config)
    assert hf_state_dict_order(shape) == list(model.state_dict())
    short = hf_state_dict_order(shape, include_tied_lm_head=False)
    assert ("lm_head.weight" in short) is (not tied)


def test_hf_names_for():
    shape = ModelShape.from_hf_config(tiny("qwen2").config)
    assert hf_names_for("decoder.layers.0.self_attention.linear_qkv.bias", shape, 1) == [
        "model.layers.1.self_attn.q_proj.bias",
        "model.layers.1.self_attn.k_proj.bias",
        "model.layers.1.self_attn.v_proj.bias",
    ]
    assert hf_names_for("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", shape, 0) == [
        "model.layers.1.post_attention_layernorm.weight"
    ]
    assert hf_names_for("output_layer.weight", shape, 0) == ["lm_head.weight"]


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_load_hf_shard_equals_in_memory(tmp_path, arch, tied, sharded):
    model = tiny(arch, vocab=103, tied=tied)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB" if sharded else "10GB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json") is sharded
    if sharded:
        assert len(set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())) > 2
    sd = model.state_dict()
    shape = ModelShape.from_hf_config(model.config)
    tp, vp = 2, padded_vocab_size(103, 2)
    for stage in range(2):  # PP=2: a tied last stage reads its head from embed_tokens (lm_head is not saved)
        names, offset = stage_names(shape, 2, stage)
        for r in range(tp):
            kw = dict(tp_size=tp, tp_rank=r, layer_offset=offset, padded_vocab=vp)
            ref = megatron_shard_from_hf(sd, names, shape, **kw)
            got = load_hf_shard(str(tmp_path), names, shape, dtype=torch.float32, **kw)
            assert set(got) == set(ref) == set(names)
            for name in names:
                assert torch.equal(got[name], ref[name]), name
    half = load_hf_shard(str(tmp_path), names, shape, dtype=torch.bfloat16, **kw)
    assert all(t.dtype == torch.bfloat16 for t in half.values())


def test_load_reads_slices_not_whole_tensors(tmp_path, monkeypatch):
    """Rank 1 of 2 asks safetensors for its half of the embedding, not the full tensor."""
    import safetensors

    model = tiny("llama")
    model.save_pretrained(tmp_path)
    shape = ModelShape.from_hf_config(model.config)
    asked = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *a, **k):
            self.f = real_open(*a, **k)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def keys(self):
            return self.f.keys()

        def get_slice(self, name):
            sl = self.f.get_slice(name)

            class S:
                def __getitem__(self, idx):
                    out = sl[idx]
                    asked.append((name, tuple(out.shape)))
                    return out

            return S()

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    load_hf_shard(
        str(tmp_path),
        ["embedding.word_embeddings.weight"],
        shape,
        tp_size=2,
        tp_rank=1,
        layer_offset=0,
        padded_vocab=104,
        dtype=torch.float32,
    )
    assert asked == [("model.embed_tokens.weight", (52, 32))]


def test_errors_name_the_problem(tmp_path):
    model = tiny("llama")
    sd = model.state_dict()
    shape = ModelShape.from_hf_config(model.config)
    kw = dict(tp_size=1, tp_rank=0, layer_offset=0, padded_vocab=104)
    with pytest.raises(KeyError, match="decoder.layers.0.mlp.router.weight"):
        megatron_shard_from_hf(sd, ["decoder.layers.0.mlp.router.weight"], shape, **kw)
    with pytest.raises(KeyError, match="no q/k/v biases"):
        megatron_shard_from_hf(sd, ["decoder.layers.0.self_attention.linear_qkv.bias"], shape, **kw)
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.down_proj.weight"}
    with pytest.raises(KeyError, match=r"model.layers.1.mlp.down_proj.weight.*decoder.layers.1.mlp.linear_fc2"):
        megatron_shard_from_hf(missing, ["decoder.layers.1.mlp.linear_fc2.weight"], shape, **kw)
    with pytest.raises(KeyError, match="layer 2 of 2"):
        megatron_shard_from_hf(sd, ["decoder.layers.1.mlp.linear_fc2.weight"], shape, **{**kw, "layer_offset": 1})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        megatron_shard_from_hf(
            sd, ["decoder.final_layernorm.weight"], shape, **{**kw, "tp_size": 4, "padded_vocab": 104}
        )
    with pytest.raises(ValueError, match="expected"):
        hf_pieces_from_shard("decoder.layers.0.mlp.linear_fc2.weight", torch.zeros(32, 32), shape, **kw)
    torch.save(sd, tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"\.bin checkpoints are not read.*safe_serialization=True"):
        load_hf_shard(str(tmp_path), ["decoder.final_layernorm.weight"], shape, dtype=torch.float32, **kw)
    # the extra state megatron adds to every layer is skipped, not an error
    assert (
        megatron_shard_from_hf(sd, ["decoder.layers.0.self_attention.core_attention._extra_state"], shape, **kw) == {}
    )
