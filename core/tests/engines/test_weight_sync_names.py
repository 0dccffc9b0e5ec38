"""verl.engines.weight_sync.names: the checks every rollout engine with its own checkpoint copy shares."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from verl.engines.weight_sync.names import (
    UnknownWeightError,
    check_specs,
    checkpoint_shapes,
    fused_group,
    tied_embeddings,
    update_buckets,
)

LAYER = "model.layers.0"
SHAPES = {
    "model.embed_tokens.weight": (16, 8),
    f"{LAYER}.self_attn.q_proj.weight": (8, 8),
    f"{LAYER}.self_attn.k_proj.weight": (4, 8),
    f"{LAYER}.self_attn.v_proj.weight": (4, 8),
    f"{LAYER}.mlp.gate_proj.weight": (12, 8),
    f"{LAYER}.mlp.up_proj.weight": (12, 8),
    "model.norm.weight": (8,),
    "lm_head.weight": (16, 8),
}


def _stream(names):
    return [(n, torch.full(SHAPES[n], float(i))) for i, n in enumerate(names)]


def test_checkpoint_shapes_reads_headers_and_adds_the_tied_head(tmp_path) -> None:
    save_file(
        {"model.embed_tokens.weight": torch.zeros(16, 8), "model.norm.weight": torch.ones(8)},
        tmp_path / "a.safetensors",
    )
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    assert tied_embeddings(tmp_path)
    assert checkpoint_shapes(tmp_path) == {
        "model.embed_tokens.weight": (16, 8),
        "model.norm.weight": (8,),
        "lm_head.weight": (16, 8),
    }


def test_checkpoint_without_safetensors_names_the_fix(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="safe_serialization=True"):
        checkpoint_shapes(tmp_path)


def test_fused_group_lists_the_members_present_in_the_checkpoint() -> None:
    assert fused_group(f"{LAYER}.self_attn.k_proj.weight", SHAPES) == frozenset(
        f"{LAYER}.self_attn.{p}_proj.weight" for p in "qkv"
    )
    assert fused_group("model.norm.weight", SHAPES) is None


@pytest.mark.parametrize(
    ("specs", "error", "fragment"),
    [
        ([(f"{LAYER}.self_attn.q_prj.weight", (8, 8))], UnknownWeightError, "did you mean"),
        ([("model.norm.weight", (9,))], ValueError, "has shape (9,), the rollout model expects (8,)"),
        ([(f"{LAYER}.mlp.up_proj.weight", (12, 8))], ValueError, f"without ['{LAYER}.mlp.gate_proj.weight']"),
    ],
)
def test_check_specs_refuses_and_names_the_engine(specs, error, fragment) -> None:
    with pytest.raises(error) as info:
        check_specs(specs, SHAPES, engine="sglang")
    assert fragment in str(info.value) and "(sglang)" in str(info.value)


def test_buckets_never_split_a_fused_group_and_respect_the_size() -> None:
    names = list(SHAPES)
    # 1 byte per bucket: every tensor would close a bucket, except while a fused group is open.
    buckets = list(update_buckets(_stream(names), SHAPES, bucket_bytes=1, tied=False))
    assert [[n for n, _ in b] for b in buckets] == [
        ["model.embed_tokens.weight"],
        [f"{LAYER}.self_attn.{p}_proj.weight" for p in "qkv"],
        [f"{LAYER}.mlp.gate_proj.weight", f"{LAYER}.mlp.up_proj.weight"],
        ["model.norm.weight"],
        ["lm_head.weight"],
    ]
    # A bucket big enough for everything is one bucket; values arrive unchanged and copied.
    stream = _stream(names)
    (only,) = list(update_buckets(iter(stream), SHAPES, bucket_bytes=1 << 30, tied=False))
    assert [n for n, _ in only] == names
    for (_, sent), (_, got) in zip(stream, only, strict=True):
        assert torch.equal(sent, got) and sent.data_ptr() != got.data_ptr()


def test_tied_embedding_carries_the_head_along() -> None:
    (bucket,) = list(update_buckets(_stream(["model.embed_tokens.weight"]), SHAPES, bucket_bytes=1, tied=True))
    assert [n for n, _ in bucket] == ["model.embed_tokens.weight", "lm_head.weight"]
    assert bucket[0][1] is bucket[1][1]


def test_a_bad_bucket_raises_before_it_is_yielded() -> None:
    bad = [("model.norm.weight", torch.zeros(8)), ("model.nrm.weight", torch.zeros(8))]
    got = []
    with pytest.raises(UnknownWeightError):
        for bucket in update_buckets(iter(bad), SHAPES, bucket_bytes=1 << 30, tied=False):
            got.append(bucket)
    assert got == []
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(update_buckets(iter(bad), SHAPES, bucket_bytes=0, tied=False))
