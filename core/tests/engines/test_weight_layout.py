"""The rollout's tensor-parallel layout, the allocation tracker and the one-process paths of the weight sync."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from verl.engines.reference.rollout import HFRolloutEngine
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.engines.weight_sync.colocated import ColocatedCheckpointEngine, WeightCheckError
from verl.engines.weight_sync.layout import (
    ShardSlice,
    TensorParallelLayout,
    UnsupportedLayoutError,
    model_module_styles,
    tensor_parallel_problems,
)
from verl.engines.weight_sync.reshard import ReshardStats, reshard_weights
from verl.testing.memory import AllocationTracker
from verl.testing.tiny import make_tiny_tokenizer, save_tiny_model

SMOLLM2 = LlamaConfig(  # SmolLM2-135M's attention shape: 9 heads, 3 key/value heads
    hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152
)


def test_llama_layout_splits_as_megatron():
    layout = TensorParallelLayout.for_model(LlamaConfig(), world_size=4, tp_size=2)
    assert layout.dp_size == 2 and layout.group(3) == [2, 3] and layout.tp_rank(3) == 1
    q = "model.layers.7.self_attn.q_proj.weight"
    assert layout.slice_for(q, (8, 4), rank=1) == ShardSlice(0, 4, 8)  # column-parallel: rows
    assert layout.slice_for("model.layers.0.self_attn.o_proj.weight", (4, 8), 2) == ShardSlice(1, 0, 4)  # row-parallel
    assert layout.slice_for("model.layers.0.mlp.down_proj.bias", (4,), 1) is None  # row-parallel bias: replicated
    assert layout.slice_for("model.embed_tokens.weight", (10, 4), 1) == ShardSlice(0, 5, 10)  # vocab-parallel
    assert layout.slice_for("lm_head.weight", (10, 4), 0) == ShardSlice(0, 0, 5)
    assert layout.slice_for("model.layers.0.input_layernorm.weight", (4,), 1) is None
    with pytest.raises(ValueError, match="not divisible by 2"):
        layout.slice_for(q, (7, 4), 0)


def test_qwen2_qkv_bias_follows_its_projection():
    layout = TensorParallelLayout.for_model(Qwen2Config(), world_size=2, tp_size=2)
    assert layout.slice_for("model.layers.0.self_attn.k_proj.bias", (6,), 1) == ShardSlice(0, 3, 6)


def test_tp_problems_name_the_key_the_sizes_and_valid_choices():
    assert tensor_parallel_problems(SMOLLM2, 1, 2) == []
    assert tensor_parallel_problems(SMOLLM2, 3, 3) == []
    problems = tensor_parallel_problems(SMOLLM2, 2, 2)
    assert problems == [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2 does not divide num_attention_heads (9); "
        "valid sizes for this model and world: [1]",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2 does not divide num_key_value_heads (3); "
        "valid sizes for this model and world: [1]",
    ]
    assert "valid sizes for this model and world: [1, 3]" in tensor_parallel_problems(SMOLLM2, 2, 6)[0]
    with pytest.raises(ValueError, match="divide the rollout world size 3"):
        TensorParallelLayout(3, 2, {})


def test_a_model_without_a_tp_plan_is_refused():
    config = SimpleNamespace(model_type="mystery", base_model_tp_plan=None, num_attention_heads=4)
    with pytest.raises(UnsupportedLayoutError, match="no tensor-parallel plan for model type 'mystery'"):
        model_module_styles(config)
    packed = SimpleNamespace(model_type="moe", base_model_tp_plan={"layers.*.mlp.experts": "grouped_gemm"})
    with pytest.raises(UnsupportedLayoutError, match="grouped_gemm"):
        model_module_styles(packed)


def test_allocation_tracker_counts_new_storages_only():
    keep = torch.zeros(1000)
    with AllocationTracker() as tracker:
        view = keep[:10]  # a view: free
        keep.add_(1.0)  # in place: free
        a = torch.empty(256, dtype=torch.uint8)
        b = torch.cat([keep, keep])  # 8000 bytes
        del b
        c = a[:16].clone()
    assert tracker.peak == 256 + 8000 + 0 and tracker.largest == 8000
    assert tracker.current == 256 + 16  # a and c alive
    del a, c, view


def test_reshard_on_one_process_yields_the_weights_themselves():
    weights = [("model.layers.0.self_attn.q_proj.weight", torch.randn(4, 2)), ("model.norm.weight", torch.ones(2))]
    stats = ReshardStats()
    out = list(
        reshard_weights(weights, TensorParallelLayout(1, 1, {}), bucket_bytes=64, rank=0, world_size=1, stats=stats)
    )
    assert [n for n, _ in out] == [n for n, _ in weights]
    assert all(o.data_ptr() == w.data_ptr() for (_, o), (_, w) in zip(out, weights, strict=True))  # views, no copy
    assert stats.buckets == 0 and stats.sent_bytes == 0 and stats.tensors == 2
    with pytest.raises(ValueError, match="spans 2 ranks but the trainer's group has 1"):
        list(reshard_weights(weights, TensorParallelLayout(2, 1, {}), bucket_bytes=64, rank=0, world_size=1))


def test_colocated_sync_refuses_a_bad_update_before_writing(tmp_path):
    """The rollout's check runs on the whole manifest first: a wrong shape anywhere writes nothing."""
    model_dir = save_tiny_model(tmp_path / "m", num_layers=1, hidden_size=32)
    other = save_tiny_model(tmp_path / "o", num_layers=1, hidden_size=16)
    tok = make_tiny_tokenizer()
    rollout = HFRolloutEngine(model_dir, tok, SimpleNamespace(response_length=4), device="cpu")
    before = {n: t.clone() for n, t in rollout.model.state_dict().items()}
    trainer = ReferenceTrainingEngine(str(other), EngineSettings())
    with pytest.raises(WeightCheckError, match="refused before writing anything.*embed_tokens.weight"):
        ColocatedCheckpointEngine().sync(trainer, rollout)
    assert all(torch.equal(before[n], t) for n, t in rollout.model.state_dict().items())
    same = ReferenceTrainingEngine(str(model_dir), EngineSettings())
    metrics = ColocatedCheckpointEngine().sync(same, rollout)
    assert metrics["tensors"] == len(before) and metrics["shared"] is False


def test_level1_host_copy_round_trips_a_storage():
    """What sleep level 1 does on an accelerator (save to host, free, re-allocate, restore), run on CPU storage."""
    from verl.engines.reference.rollout_weights import host_copy, restore_from_host

    weight = torch.randn(6, 5)
    want = weight.clone()
    storage = weight.untyped_storage()
    backup = host_copy(storage, pin=False)
    nbytes = storage.nbytes()
    storage.resize_(0)
    assert weight.untyped_storage().nbytes() == 0
    storage.resize_(nbytes)
    restore_from_host(weight.untyped_storage(), backup)
    assert torch.equal(weight, want)


def test_engines_that_replicate_kv_heads_accept_more_ranks_than_kv_heads():
    """vLLM/SGLang replicate key/value heads and pad the vocabulary: only heads and MLP width must divide."""
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2, vocab_size=101
    )
    assert tensor_parallel_problems(config, 4, 4, engine="vllm") == []
    assert any("num_key_value_heads (2)" in p for p in tensor_parallel_problems(config, 4, 4, engine="hf"))
    assert any("vocab_size (101)" in p for p in tensor_parallel_problems(config, 4, 4, engine="hf"))
    odd = LlamaConfig(hidden_size=48, intermediate_size=96, num_attention_heads=6, num_key_value_heads=4)
    assert "replicates key/value heads only then" in tensor_parallel_problems(odd, 3, 3, engine="vllm")[-1]


def test_update_while_asleep_wakes_the_weights_first(tmp_path):
    """A level-2 sleep freed the storages: an update must re-allocate them before writing (never into 0 bytes)."""
    model_dir = save_tiny_model(tmp_path / "m", num_layers=1, hidden_size=32)
    tok = make_tiny_tokenizer()
    from verl.engines.reference.builders import HFRolloutOptions

    cfg = SimpleNamespace(response_length=4)
    rollout = HFRolloutEngine(model_dir, tok, cfg, device="cpu", options=HFRolloutOptions(sleep_level=2))
    weights = {n: t.clone() for n, t in rollout.model.state_dict().items()}
    rollout.sleep()
    assert rollout.weights.owned_bytes() == 0 and rollout.weights.asleep
    rollout.update_weights(iter(weights.items()))
    assert not rollout.weights.asleep and rollout.weights.stale() == []
    assert all(torch.equal(rollout.model.state_dict()[n], t) for n, t in weights.items())


def test_offload_keeps_the_weights_a_rollout_generates_from():
    """param_offload with the rollout sharing the trainer's module: only the optimizer state may move."""
    from verl.config import load_config
    from verl.engines.reference.offload import HostOffload
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    calls = []

    class Engine(HostOffload):
        def __init__(self, model):
            self.model = model

        def offload(self, *, keep_params=False):
            calls.append(keep_params)
            return {}

    module = torch.nn.Linear(2, 2)
    worker = ActorRolloutRefWorker(load_config())
    worker.rollout = SimpleNamespace(model=module)
    worker._offload(Engine(module))
    worker._offload(Engine(torch.nn.Linear(2, 2)))
    assert calls == [True, False]
