"""Shared pieces of the verl-sglang tests: the tiny model, and recording stand-ins of SGLang's engine API.

The stand-ins show the order and the arguments of our calls into ``sglang.Engine``; they never show that SGLang
works. The real-SGLang tests (``test_sglang_real.py``) check the parts of SGLang that run on CPU.
"""

from __future__ import annotations

import importlib.util
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
import torch

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """The conformance kit's tiny Llama (tied embeddings, multi-EOS generation config), saved once."""
    from verl.testing.conformance import save_conformance_model

    return save_conformance_model(tmp_path_factory.mktemp("sglang_model") / "model")


class StandInFlattenedBucket:
    """Stand-in of ``sglang.srt.weight_sync.tensor_bucket.FlattenedTensorBucket`` (same constructor and
    getters): concatenates the tensors' bytes and records ``(name, shape, dtype, start, end)`` per tensor. A
    stand-in: it shows what we hand to the bucket class, never that SGLang's class accepts it."""

    def __init__(self, named_tensors=None, flattened_tensor=None, metadata=None):
        if named_tensors is not None:
            parts, self.metadata, offset = [], [], 0
            for name, tensor in named_tensors:
                flat = tensor.contiguous().flatten().view(torch.uint8)
                parts.append(flat)
                self.metadata.append(
                    SimpleNamespace(
                        name=name,
                        shape=tensor.shape,
                        dtype=tensor.dtype,
                        start_idx=offset,
                        end_idx=offset + flat.numel(),
                    )
                )
                offset += flat.numel()
            self.flattened_tensor = torch.cat(parts)
        else:
            self.flattened_tensor, self.metadata = flattened_tensor, metadata

    def get_flattened_tensor(self):
        return self.flattened_tensor

    def get_metadata(self):
        return self.metadata

    def reconstruct_tensors(self):
        return [
            (m.name, self.flattened_tensor[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape))
            for m in self.metadata
        ]


class PickleSerializerStandIn:
    """Stand-in of ``MultiprocessingSerializer`` (plain pickle of host tensors; SGLang's uses ForkingPickler)."""

    @staticmethod
    def serialize(obj):
        return pickle.dumps(obj)

    @staticmethod
    def deserialize(data):
        return pickle.loads(data)


def standin_weight_api():
    """A :class:`verl_sglang.weights.SGLangWeightAPI` of stand-ins (host tensors, no IPC)."""
    from verl_sglang.weights import SGLangWeightAPI

    return SGLangWeightAPI(StandInFlattenedBucket, PickleSerializerStandIn, None, ipc=False)


class RecordingSGLangEngineStandIn:
    """Recording stand-in of ``sglang.Engine`` as of sglang 0.5.8 (no weight-update session).

    It shows our call order and arguments, not that SGLang works: it records every call in ``calls``
    (``(method, details)``), answers ``generate`` from a fixed rule (row ``i`` gets ``[first prompt token + 1,
    ..., + k]`` of ``min(3, max_new_tokens)`` tokens, then the first stop id when ``max_new_tokens`` allows, with
    log-prob ``-0.25 * (position + 1)``), keeps the tensors of each weight payload it is sent (decoded with
    ``serializer`` / ``bucket_cls``) and, like SGLang's scheduler, refuses to resume a tag that is not released.
    """

    serializer: Any = PickleSerializerStandIn
    bucket_cls: Any = StandInFlattenedBucket
    last: RecordingSGLangEngineStandIn | None = None

    def __init__(self, **server_args):
        self.server_args = server_args
        self.calls: list[tuple[str, Any]] = []
        self.released: set[str] = set()
        self.loads: list[list[tuple[str, torch.Tensor]]] = []
        self.update_results: list[Any] = []  # queued answers of update_weights_from_tensor
        type(self).last = self

    def generate(self, input_ids=None, sampling_params=None, return_logprob=False, **kwargs):
        self.calls.append(("generate", {"rows": len(input_ids), "return_logprob": return_logprob}))
        self.requests = list(zip(input_ids, sampling_params, strict=True))
        outputs = []
        for row, params in zip(input_ids, sampling_params, strict=True):
            limit = params["max_new_tokens"]
            tokens = [row[0] + k + 1 for k in range(min(3, limit))]
            if params["stop_token_ids"] and len(tokens) < limit:
                tokens.append(params["stop_token_ids"][0])
            meta = {"finish_reason": {"type": "stop" if len(tokens) < limit else "length"}}
            if return_logprob:
                meta["output_token_logprobs"] = [(-0.25 * (k + 1), t, None) for k, t in enumerate(tokens)]
            outputs.append({"output_ids": tokens, "meta_info": meta})
        return outputs

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(
            (
                "update_weights_from_tensor",
                {"payloads": len(named_tensors), "load_format": load_format, "flush_cache": flush_cache},
            )
        )
        if self.update_results:
            return self.update_results.pop(0)
        decoded = self.serializer.deserialize(named_tensors[0])
        bucket = self.bucket_cls(flattened_tensor=decoded["flattened_tensor"], metadata=decoded["metadata"])
        self.loads.append([(n, t.clone()) for n, t in bucket.reconstruct_tensors()])
        return (True, "Success")

    def flush_cache(self):
        self.calls.append(("flush_cache", None))
        return SimpleNamespace(success=True, message="")

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release_memory_occupation", list(tags)))
        self.released.update(tags)

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume_memory_occupation", list(tags)))
        for tag in tags:
            self.released.remove(tag)  # KeyError on a tag that is not released, as SGLang's offload_tags.remove

    def shutdown(self):
        self.calls.append(("shutdown", None))

    def names(self) -> list[str]:
        """The method names of ``calls``, in order."""
        return [name for name, _ in self.calls]


class RecordingSGLangSessionEngineStandIn(RecordingSGLangEngineStandIn):
    """Recording stand-in of ``sglang.Engine`` as of sglang 0.5.2x: ``update_weights_from_tensor`` answers
    ``(False, "... must run between begin_weight_update() and end_weight_update()")`` outside a session, as
    SGLang's scheduler does. Shows our call order only."""

    def __init__(self, **server_args):
        super().__init__(**server_args)
        self.session = False

    def begin_weight_update(self, selector="all"):
        self.calls.append(("begin_weight_update", None))
        if self.session:
            return (False, "a weight-update session is already open; call end_weight_update() first")
        self.session = True
        return (True, "Success")

    def end_weight_update(self):
        self.calls.append(("end_weight_update", None))
        if not self.session:
            return (False, "no weight-update session is open; call begin_weight_update() first")
        self.session = False
        return (True, "Success")

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        if not self.session:
            self.calls.append(("update_weights_from_tensor", {"refused": True}))
            return (False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()")
        return super().update_weights_from_tensor(named_tensors, load_format, flush_cache)


@pytest.fixture
def standin_api():
    return standin_weight_api()


@pytest.fixture
def session_standin():
    """The 0.5.2x-style recording stand-in class (weight-update session required)."""
    return RecordingSGLangSessionEngineStandIn


@pytest.fixture
def plain_standin():
    """The 0.5.8-style recording stand-in class (no session)."""
    return RecordingSGLangEngineStandIn
