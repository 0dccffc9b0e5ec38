"""GGUF -> HF conversion on a tiny GGUF written here with the `gguf` package (no download).

The tiny GGUF is produced from a known HF Llama the way llama.cpp's converter does (q/k rows
permuted for its rotary layout), so the converted folder must reproduce the original model's
logits exactly and keep the tokenizer's special tokens and chat template.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None,
    reason="GGUF conversion needs the optional packages gguf and accelerate (verl-core[gguf])",
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HEADS, KV_HEADS, HIDDEN, LAYERS = 4, 2, 32, 2
_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: interleaved -> half-split rotary rows.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path):
    """Write a 2-layer Llama + byte-level BPE tokenizer as GGUF; return the reference HF model."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = SPECIAL + list(bytes_to_unicode().values()) + ["he"]
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(2 * HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(["h e"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    for i in range(LAYERS):
        for hf_name, gguf_name in _GGUF_NAMES.items():
            t = sd[f"model.layers.{i}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                t = _llama_cpp_permute(t, HEADS)
            elif gguf_name == "attn_k":
                t = _llama_cpp_permute(t, KV_HEADS)
            w.add_tensor(f"blk.{i}.{gguf_name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from verl.models import convert_gguf_to_hf

    root = tmp_path_factory.mktemp("gguf")
    reference = write_tiny_gguf(root / "tiny.gguf")
    messages: list[str] = []
    out = convert_gguf_to_hf(root / "tiny.gguf", root / "hf", progress=messages.append)
    return out, reference, messages


def test_converted_folder_is_a_plain_safetensors_model(converted):
    import json

    out, _, messages = converted
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert any("converted in" in m for m in messages)


def test_converted_model_reproduces_reference_logits(converted):
    from transformers import AutoModelForCausalLM

    out, reference, _ = converted
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[1, 90, 60, 70, 3, 200, 259, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-6)


def test_converted_tokenizer_keeps_specials_and_chat_template(converted):
    from verl.models import load_tokenizer

    out, _, _ = converted
    tok = load_tokenizer(out)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.pad_token_id == 2 and tok.padding_side == "left"
    text = tok.apply_chat_template([{"role": "user", "content": "hey"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhey<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and 2 in ids  # special tokens stay whole
    assert 259 in ids  # the "h e" merge applies
    assert tok.decode(ids) == text


def test_resolve_builtin_name_end_to_end_with_tiny_wheel(tmp_path, monkeypatch):
    """A fake wheel shipping the tiny GGUF goes through the real conversion once, then the cache."""
    from verl.models import resolve
    from verl.models.gguf import WheelGGUFSource

    site = tmp_path / "site"
    (site / "tiny_gguf_wheel").mkdir(parents=True)
    (site / "tiny_gguf_wheel" / "__init__.py").write_text("")
    write_tiny_gguf(site / "tiny_gguf_wheel" / "Tiny.Q8.gguf")
    dist = site / "tiny_gguf_wheel-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-gguf-wheel\nVersion: 0.3\n")
    monkeypatch.syspath_prepend(str(site))
    source = WheelGGUFSource(
        distribution="tiny-gguf-wheel", package="tiny_gguf_wheel", pattern="*.gguf", display_name="Tiny"
    )
    monkeypatch.setitem(resolve.BUILTIN_MODELS, "tiny-test-model", source)
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))

    lines: list[str] = []
    path = resolve.resolve_model_path("tiny-test-model", progress=lines.append)
    assert path == tmp_path / "cache" / "models" / "tiny-test-model"
    assert any("one-time conversion" in line for line in lines)
    resolve.check_causal_lm_folder(path)
    lines.clear()
    assert resolve.resolve_model_path("tiny-test-model", progress=lines.append) == path
    assert lines == []  # served from the cache
    shutil.rmtree(site)
