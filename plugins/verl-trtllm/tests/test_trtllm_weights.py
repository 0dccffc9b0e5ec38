"""The weight-update payload and the worker extension (no TensorRT-LLM; CPU tensors)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import torch
from torch.multiprocessing.reductions import reduce_tensor
from verl_trtllm.engine_args import EXTENSION_QUALNAME
from verl_trtllm.weights import decode_payload, ipc_payload, stage_stream


def test_stage_stream_copies_each_tensor_before_the_next_is_asked_for():
    emb = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ids = torch.tensor([1, 2, 3])
    asked = []

    def sender():  # reuses its buffer for the next tensor, as a sender may
        buffer = emb.clone()
        asked.append("embed")
        yield "model.embed_tokens.weight", buffer
        buffer.fill_(-1.0)
        asked.append("ids")
        yield "ids", ids

    stream = stage_stream(sender(), torch.device("cpu"), torch.bfloat16)
    name, head = next(stream)
    assert asked == ["embed"]  # the copy exists before the sender is asked for more
    (name_ids, ints), *rest = list(stream)
    assert (name, name_ids, rest) == ("model.embed_tokens.weight", "ids", [])
    assert head.dtype == torch.bfloat16 and ints.dtype == torch.int64  # integers keep their dtype
    assert torch.equal(head.float(), emb)  # the reused buffer (now -1) did not reach the copy
    assert ints.data_ptr() != ids.data_ptr() and torch.equal(ints, ids)  # always a fresh copy
    assert head.is_contiguous() and ints.is_contiguous()


def test_ipc_payload_is_keyed_by_uuid_and_rebuilds_with_torch_reduce_tensor():
    """Round trip on CPU tensors with torch's real ``reduce_tensor`` (a CUDA handle differs: TensorRT-LLM's worker
    then opens the memory through CUDA IPC and sets the device index, ``args[6]``); this checks our wrapping of it:
    the uuid key, base64 of a pickled ``[(name, (rebuild_fn, args))]`` list in bucket order."""
    a, b = torch.randn(3, 4), torch.arange(5)
    payload = ipc_payload([("a", a), ("b", b)], "GPU-1234", reduce_tensor)
    assert list(payload) == ["GPU-1234"] and isinstance(payload["GPU-1234"], str)
    handles = decode_payload(payload, "GPU-1234")
    assert [name for name, _ in handles] == ["a", "b"]
    (fn_a, args_a), (fn_b, args_b) = (h for _, h in handles)
    assert torch.equal(fn_a(*args_a), a) and torch.equal(fn_b(*args_b), b)


def test_worker_extension_adds_only_verl_prefixed_methods():
    """TensorRT-LLM refuses an extension attribute its worker already has; ours add only ``verl_*`` names on top of
    TensorRT-LLM's own extension (``object`` here, where TensorRT-LLM is not installed)."""
    module_name, class_name = EXTENSION_QUALNAME.rsplit(".", 1)
    cls = getattr(importlib.import_module(module_name), class_name)
    own = [name for name in vars(cls) if not name.startswith("__")]
    assert own == ["verl_reset_prefix_cache"]
    calls = []
    worker = cls()
    worker.engine = SimpleNamespace(reset_prefix_cache=lambda: calls.append("reset"))
    worker.verl_reset_prefix_cache()
    assert calls == ["reset"]
