"""The parts of the real SGLang that import and run on CPU, against our translation (the ``plugin(sglang)`` venv:
sglang installed ``--no-deps`` with its pure-Python dependencies and triton; see the README).

Real here: ``ServerArgs`` built from our launch arguments (construction only: resolving it needs torchvision and a
GPU), its field list against our source reader and snapshot, SGLang's ``SamplingParams`` normalising and verifying
our sampling dicts, and our weight payloads through the real ``FlattenedTensorBucket`` /
``MultiprocessingSerializer`` on CPU tensors, rebuilt the way SGLang's weight updater does.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

server_args_module = pytest.importorskip("sglang.srt.server_args", reason="sglang is not installed in this venv")

from verl_sglang.backend import sglang_version  # noqa: E402
from verl_sglang.options import SGLangRolloutOptions  # noqa: E402
from verl_sglang.server_args import build_server_args  # noqa: E402
from verl_sglang.server_args_fields import read_server_args_fields, server_args_fields, sglang_package_dir  # noqa: E402
from verl_sglang.translate import sampling_params  # noqa: E402
from verl_sglang.weights import BucketPacker, dtype_groups, load_weight_api  # noqa: E402

from verl.engines.reference.sampling import SamplingParams as VerlSampling  # noqa: E402

ServerArgs = server_args_module.ServerArgs


def _live_fields() -> set[str]:
    struct = getattr(ServerArgs, "__struct_fields__", None)  # msgspec (0.5.2x)
    return set(struct) if struct is not None else {f.name for f in dataclasses.fields(ServerArgs)}


def test_source_reader_finds_exactly_the_live_server_args_fields():
    assert set(read_server_args_fields(sglang_package_dir())) == _live_fields()
    assert server_args_fields().source.startswith(f"installed sglang {sglang_version()}")


def test_snapshot_matches_the_installed_version_it_was_made_from():
    from verl_sglang import _server_args_snapshot as snapshot

    if sglang_version() != snapshot.SGLANG_VERSION:
        pytest.skip(f"snapshot is of sglang {snapshot.SGLANG_VERSION}, installed {sglang_version()}")
    assert set(snapshot.FIELDS) == _live_fields()


def test_every_option_is_a_live_server_args_field():
    live = _live_fields()
    assert set(SGLangRolloutOptions.passthrough) <= live and set(SGLangRolloutOptions.set_by_plugin) <= live
    public = {n for n in live if not n.startswith("_")}
    own = {"enable_weights_cpu_backup", "log_level", "port", "attention_backend"}
    assert set(SGLangRolloutOptions.passthrough) | set(SGLangRolloutOptions.set_by_plugin) | own == public


def _rollout(**kw):
    values = dict(
        engine_kwargs={},
        load_format="auto",
        gpu_memory_utilization=0.4,
        enforce_eager=True,
        enable_chunked_prefill=False,
        enable_prefix_caching=True,
        max_num_batched_tokens=2048,
        max_model_len=None,
        max_num_seqs=16,
        cudagraph_capture_sizes=None,
        seed=3,
        dtype="bf16",
        prompt_length=32,
        response_length=16,
    )
    values.update(kw)
    return SimpleNamespace(**values)


@pytest.mark.parametrize("device_kind", ["cuda", "cpu"])
def test_server_args_build_from_our_translation(tmp_path, device_kind):
    options = SGLangRolloutOptions(chunked_prefill_size=None, enable_deterministic_inference=True, log_level="info")
    args = build_server_args(
        model_path=str(tmp_path),
        rollout=_rollout(),
        options=options,
        fields=server_args_fields().names,
        device_kind=device_kind,
        base_gpu_id=1,
        tp_size=2,
        context=50,
        port=30123,
        trust_remote_code=False,
        model_overrides={"rope_theta": 10000.0},
        sglang_version=sglang_version(),
    )
    built = ServerArgs(**args)  # an unknown or misspelt key raises TypeError here
    for key, value in args.items():
        assert getattr(built, key) == value, key


def test_sglang_sampling_params_take_our_dicts():
    from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

    sampled = sampling_params(
        VerlSampling(do_sample=True, temperature=0.7, top_p=0.9, top_k=-1),
        max_new_tokens=8,
        stop_token_ids=[2, 5],
        seed=11,
    )
    sp = SamplingParams(**sampled)
    sp.verify(vocab_size=104)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.sampling_seed, sp.max_new_tokens) == (0.7, 0.9, TOP_K_ALL, 11, 8)
    assert sp.stop_token_ids == {2, 5} and sp.n == 1
    greedy = SamplingParams(
        **sampling_params(
            VerlSampling(do_sample=False, temperature=1.0, top_p=1.0, top_k=-1),
            max_new_tokens=4,
            stop_token_ids=[2],
            seed=None,
        )
    )
    greedy.verify(vocab_size=104)
    assert (greedy.top_k, greedy.temperature) == (1, 1.0)  # SGLang's greedy: argmax through top_k=1
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=0).verify(vocab_size=104)  # why verl's top_k=0 is sent as -1


def _receive(payload: bytes) -> list[tuple[str, torch.Tensor]]:
    """SGLang's receiving path: the tokenizer manager's payload normalisation, the TP worker's deserialisation,
    then weight_updater._update_weights_from_flattened_bucket's metadata conversion and reconstruction."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.common import normalize_serialized_named_tensor_payloads
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket, FlattenedTensorMetadata

    [raw] = normalize_serialized_named_tensor_payloads([payload])
    data = MultiprocessingSerializer.deserialize(raw)
    metadata = [
        FlattenedTensorMetadata(
            name=m.name, shape=m.shape, dtype=m.dtype, start_idx=m.start_idx, end_idx=m.end_idx, numel=m.numel
        )
        for m in data["metadata"]
    ]
    bucket = FlattenedTensorBucket(flattened_tensor=data["flattened_tensor"], metadata=metadata)
    return [(n, t.clone()) for n, t in bucket.reconstruct_tensors()]


def test_payloads_round_trip_through_the_real_bucket_and_serializer():
    gen = torch.Generator().manual_seed(0)
    sent = [
        ("model.layers.0.self_attn.q_proj.weight", torch.randn(8, 4, generator=gen)),
        ("model.norm.weight", torch.randn(3, generator=gen).half()),  # 6 bytes: misaligns a float32 after it
        ("model.layers.0.mlp.up_proj.weight", torch.randn(5, 4, generator=gen)),
        ("model.embed_tokens.weight", torch.randn(7, 4, generator=gen).bfloat16()),
    ]
    packer = BucketPacker(load_weight_api(), "cpu")
    received = []
    for group in dtype_groups(sent):
        payload, _flat = packer.pack(group)
        assert isinstance(payload, bytes)
        received += _receive(payload)
    assert sorted(n for n, _ in received) == sorted(n for n, _ in sent)
    got = dict(received)
    for name, tensor in sent:
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape and torch.equal(got[name], tensor), (
            name
        )


def test_one_mixed_dtype_bucket_is_what_sglang_cannot_rebuild():
    # Why weights.dtype_groups exists: SGLang views each byte slice as its dtype, which needs aligned offsets.
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    mixed = FlattenedTensorBucket(named_tensors=[("a", torch.ones(3).half()), ("b", torch.ones(2))])
    with pytest.raises(RuntimeError, match="divisible"):
        mixed.reconstruct_tensors()
    with pytest.raises(ValueError, match="one dtype per flattened bucket"):
        BucketPacker(load_weight_api(), "cpu").pack([("a", torch.ones(3).half()), ("b", torch.ones(2))])


def test_standin_engine_receives_real_payloads_from_our_update(model_path, plain_standin):
    """Our update loop with the real weight API, into a recording stand-in that decodes with SGLang's real
    receiving path: the stand-in shows the calls, the payloads are SGLang's own format."""
    from safetensors.torch import load_file
    from verl_sglang.engine import SGLangRolloutEngine

    from verl.testing.conformance import make_rollout_config

    class RealPayloadStandIn(plain_standin):
        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            self.calls.append(("update_weights_from_tensor", {"payloads": len(named_tensors)}))
            self.loads.append(_receive(named_tensors[0]))
            return (True, "Success")

    rollout = make_rollout_config(
        tensor_model_parallel_size=1,
        checkpoint_engine=SimpleNamespace(update_weights_bucket_megabytes=1),
        load_format="auto",
        dtype="float32",
        engine_kwargs={},
    )
    engine = SGLangRolloutEngine(model_path, None, rollout, device="cpu", engine_cls=RealPayloadStandIn)
    weights = load_file(str(model_path / "model.safetensors"))
    engine.update_weights(iter(weights.items()))
    got = {n: t for load in RealPayloadStandIn.last.loads for n, t in load}
    assert set(got) == set(weights) - {"lm_head.weight"}
    assert all(torch.equal(got[n], weights[n]) for n in got)
