"""``broadcast`` checkpoint engine: bucket layout, header codec, group checks, and a 3-process gloo sync.

The multi-process test runs this file as a script (``python test_broadcast_sync.py worker ...``): pytest's
importlib mode makes test modules unimportable by name, which ``multiprocessing`` spawn would need.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from verl.config import ConfigError, structure_options
from verl.config.schema.rollout import CheckpointEngineConfig
from verl.engines.weight_sync import (
    BroadcastCheckpointEngine,
    BucketHeaderError,
    BucketPlanner,
    SyncGroupError,
    UnsupportedBackendError,
    WeightSyncAbortedError,
    bucket_capacity_bytes,
    free_port,
    plan_buckets,
)
from verl.engines.weight_sync.broadcast import BroadcastOptions
from verl.engines.weight_sync.buckets import decode_header, encode_header, header_entry, unpack_bucket
from verl.platform.cpu import CpuPlatform

PROMPTS = ["What is 2+3?", "hi", "Count: 1 2 3"]
HIDDEN = 32
# Chosen below the 104 x 32 float32 embedding (13312 bytes), so embed_tokens and lm_head each exceed a bucket.
BUCKET_BYTES = 8192

CKPT = "actor_rollout_ref.rollout.checkpoint_engine"


class FakePlatform(CpuPlatform):
    """Stand-in platform: core's CPU platform whose ``dist_backend`` is ``backend`` (the group is built by
    the real :meth:`Platform.new_sync_group` default)."""

    def __init__(self, backend: str = "gloo") -> None:
        self.dist_backend = backend


def engine_config() -> CheckpointEngineConfig:
    return CheckpointEngineConfig(backend="broadcast", update_weights_bucket_megabytes=1)


def sync_options(bucket_bytes: int | None = BUCKET_BYTES, **options) -> BroadcastOptions:
    """``engine_kwargs.broadcast`` structured as config load does (the engine gets the instance)."""
    if bucket_bytes is not None:
        options["bucket_bytes"] = bucket_bytes
    return structure_options(BroadcastOptions, options, f"{CKPT}.engine_kwargs.broadcast", "broadcast")


# ---------------------------------------------------------------- buckets


def test_bucket_capacity_is_mebibytes():
    assert bucket_capacity_bytes(2048) == 2048 * 1024 * 1024
    assert bucket_capacity_bytes(1) == 1_048_576
    assert bucket_capacity_bytes(0.5) == 524_288
    for bad in (0, -1, True, "2", None):
        with pytest.raises(ValueError, match="update_weights_bucket_megabytes"):
            bucket_capacity_bytes(bad)


def test_plan_buckets_hand_computed_layouts():
    # capacity 100, offsets aligned to 64: 10@0, 30@64 (94 <= 100); 60 needs 128+60 -> new; 200 > 100 alone;
    # 5 cannot follow an oversized tensor; 64 needs 64+64 = 128 > 100 -> new.
    assert plan_buckets([10, 30, 60, 200, 5, 64], 100) == [[(0, 0), (1, 64)], [(2, 0)], [(3, 0)], [(4, 0)], [(5, 0)]]
    # capacity 128: 64@0 + 64@64 fill it exactly; 1@0, 1@64.
    assert plan_buckets([64, 64, 1, 1], 128) == [[(0, 0), (1, 64)], [(2, 0), (3, 64)]]
    # an oversized first tensor, then a tensor of exactly the capacity.
    assert plan_buckets([500, 128], 128) == [[(0, 0)], [(1, 0)]]
    assert plan_buckets([], 128) == []


def test_planner_reports_closed_bucket_size():
    planner = BucketPlanner(128)
    assert planner.place(10) == (False, 0)
    assert planner.place(20) == (False, 64)
    assert planner.place(100) == (True, 0)
    assert planner.closed_nbytes == 84  # 64 + 20
    assert planner.open_nbytes == 100


def test_header_roundtrip_and_zero_copy_views():
    tensors = {
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "i": torch.tensor([[7, -8]], dtype=torch.int64),
        "m": torch.tensor([True, False, True]),
        "s": torch.tensor(3.0, dtype=torch.float16),
    }
    offsets = [0, 64, 128, 192, 256]  # aligned slots, each large enough for its tensor
    bucket = torch.zeros(320, dtype=torch.uint8)
    for t, off in zip(tensors.values(), offsets, strict=True):
        raw = t.reshape(-1).view(torch.uint8)
        bucket[off : off + raw.numel()] = raw
    header = encode_header(header_entry(n, t, o) for (n, t), o in zip(tensors.items(), offsets, strict=True))
    entries = decode_header(header, 320)
    out = dict(unpack_bucket(bucket, entries))
    assert list(out) == list(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t)
    assert out["w"].data_ptr() == bucket.data_ptr()  # a view, not a copy


def test_decode_header_rejects_bad_input():
    with pytest.raises(BucketHeaderError, match="cannot decode"):
        decode_header(b"\xff not json", 10)
    with pytest.raises(BucketHeaderError, match="unknown dtype 'float99'"):
        decode_header(json.dumps([{"name": "x", "dtype": "float99", "shape": [1], "offset": 0}]).encode(), 10)
    with pytest.raises(BucketHeaderError, match="'x' spans bytes \\[0, 16\\) of a 8-byte bucket"):
        decode_header(json.dumps([{"name": "x", "dtype": "float32", "shape": [4], "offset": 0}]).encode(), 8)


# ---------------------------------------------------------------- engine checks (single process)


def test_options_bucket_size_and_unknown_key():
    assert (
        BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options(None)).bucket_bytes == 1_048_576
    )
    assert BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options(4096)).bucket_bytes == 4096
    with pytest.raises(ConfigError, match=f"{CKPT}.engine_kwargs.broadcast.timeout_seconds"):
        sync_options(timeout_seconds=3)  # config load refuses it before any engine exists
    with pytest.raises(TypeError, match="options must be a BroadcastOptions"):
        BroadcastCheckpointEngine(engine_config(), FakePlatform(), options={"bucket_bytes": 4096})


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("mpi", "dist_backend 'mpi' is not supported by platform 'cpu'; supported: gloo, nccl \\(the backend"),
        ("hccl", "'hccl' is not supported by platform 'cpu'; .* built by the 'npu' platform of the verl-npu plugin"),
    ]
    + ([("nccl", "no NCCL")] if not torch.distributed.is_nccl_available() else []),
)
def test_unsupported_backend_is_a_clear_error(backend, message):
    engine = BroadcastCheckpointEngine(engine_config(), FakePlatform(backend), options=sync_options())
    with pytest.raises(UnsupportedBackendError, match=message):
        engine.init_group(master_addr="127.0.0.1", master_port=1, rank=0, world_size=2)


class RecordingPlatform(CpuPlatform):
    """Stand-in vendor platform (backend ``fakeccl``, no real group): records what the sync group asks of
    :meth:`Platform.check_sync_backend` / :meth:`Platform.new_sync_group`, the hook a vendor overrides."""

    dist_backend = "fakeccl"
    sync_backends = ("gloo", "fakeccl")

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def check_sync_backend(self, backend):
        self.calls.append(("check", backend))
        super().check_sync_backend(backend)

    def new_sync_group(self, backend, store, rank, world_size, timeout_s):
        self.calls.append(("new", backend, type(store).__name__, rank, world_size, timeout_s))
        return SimpleNamespace(shutdown=lambda: self.calls.append(("shutdown",)))


@pytest.mark.parametrize(("override", "expected"), [(None, "fakeccl"), ("gloo", "gloo")])
def test_the_platform_builds_the_group_also_for_the_gloo_override(override, expected):
    platform = RecordingPlatform()
    engine = BroadcastCheckpointEngine(engine_config(), platform, backend=override, options=sync_options())
    # rank 0 only hosts the store (wait_for_workers=False): nothing blocks, the stand-in builds no group.
    engine.init_group(master_addr="127.0.0.1", master_port=free_port(), rank=0, world_size=2, timeout_s=5)
    engine.close()
    assert platform.calls == [
        ("check", expected),  # init_group: before the store opens (new_sync_group checks again itself)
        ("new", expected, "PrefixStore", 0, 2, 5.0),
        ("shutdown",),
    ]


def test_default_hook_refuses_what_the_platform_does_not_build():
    platform = RecordingPlatform()
    with pytest.raises(
        UnsupportedBackendError, match="'nccl' is not supported by platform 'cpu'; supported: gloo, fakeccl"
    ):
        BroadcastCheckpointEngine(engine_config(), platform, backend="nccl", options=sync_options()).init_group(
            master_addr="127.0.0.1", master_port=1, rank=0, world_size=2
        )
    assert platform.calls == [("check", "nccl")]


def test_group_arguments_and_call_order_are_checked():
    engine = BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options())
    with pytest.raises(SyncGroupError, match="init_group"):
        engine.sync(SimpleNamespace(iter_weights=lambda: iter(())), None)
    with pytest.raises(TypeError, match="trainer .* or a rollout"):
        engine.sync(None, None)
    with pytest.raises(SyncGroupError, match="world_size must be >= 2"):
        engine.init_group(master_addr="127.0.0.1", master_port=1, rank=0, world_size=1)
    with pytest.raises(SyncGroupError, match="rank 3 outside \\[0, 3\\)"):
        engine.init_group(master_addr="127.0.0.1", master_port=1, rank=3, world_size=3)


def test_non_member_trainer_rank_drains_iter_weights():
    from verl.testing.tiny import make_tiny_model

    model = make_tiny_model(hidden_size=HIDDEN)
    consumed = []

    class Trainer:
        def iter_weights(self):
            for name, t in model.state_dict().items():
                consumed.append(name)
                yield name, t

    engine = BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options())
    # rank=None joins nothing: the port is never contacted.
    engine.init_group(master_addr="127.0.0.1", master_port=1, rank=None, world_size=3)
    with pytest.raises(SyncGroupError, match="ranks 1..2, this is rank None"):
        engine.sync(None, SimpleNamespace())
    metrics = engine.sync(Trainer(), None)
    assert consumed == list(model.state_dict())
    assert metrics["tensors"] == 21  # embed, 2 x 9 per layer, norm, lm_head
    assert metrics["bytes"] == 4 * sum(p.numel() for p in model.state_dict().values())
    assert metrics["buckets"] == 0
    engine.close()


def test_both_sides_in_one_process_hand_over_directly(tmp_path):
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.testing.tiny import make_tiny_model, make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    src = make_tiny_model(len(tok), hidden_size=HIDDEN, seed=1)
    rollout = HFRolloutEngine(make_tiny_model(len(tok), hidden_size=HIDDEN, seed=0), tok, SimpleNamespace())
    trainer = SimpleNamespace(iter_weights=lambda: iter(src.state_dict().items()))
    metrics = BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options()).sync(trainer, rollout)
    assert metrics["tensors"] == 21 and metrics["buckets"] == 0 and metrics["shared"] is False
    for name, t in src.state_dict().items():
        assert torch.equal(rollout.model.state_dict()[name], t)


def _sender_thread(send):
    """Rank 0 (``send(engine)``) in a thread and rank 1 joined here, of a 2-rank gloo sync group with 4 KiB
    buckets in this process (a gloo group is per object); returns ``(sender, receiver, thread)``."""
    import threading

    port = free_port()
    sender = BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options(4096))
    receiver = BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options(4096))

    def run():
        sender.init_group(master_addr="127.0.0.1", master_port=port, rank=0, world_size=2, timeout_s=30)
        send(sender)

    thread = threading.Thread(target=run)
    thread.start()
    receiver.init_group(master_addr="127.0.0.1", master_port=port, rank=1, world_size=2, timeout_s=30)
    return sender, receiver, thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads listeners from Linux's /proc")
def test_the_sync_group_listens_on_loopback_only():
    """Both ranks on this node (master 127.0.0.1): the group's store and Gloo's sockets bind loopback, never every
    interface (torch's TCPStore alone would: core/tests/platform/test_network.py), and weights still arrive."""
    from verl.testing.sockets import listening_addresses

    before = set(listening_addresses())
    seen: dict = {}
    weights = {"w": torch.arange(8.0)}
    received: dict = {}

    class Rollout:
        def update_weights(self, pairs):
            received.update((name, t.clone()) for name, t in pairs)

    def send(engine):
        seen["listeners"] = set(listening_addresses()) - before
        engine.sync(SimpleNamespace(iter_weights=lambda: iter(weights.items())), None)

    sender, receiver, thread = _sender_thread(send)
    receiver.sync(None, Rollout())
    thread.join(timeout=60)
    sender.close()
    receiver.close()
    assert seen["listeners"], "the group opened no listening socket?"
    assert {host for host, _ in seen["listeners"]} == {"127.0.0.1"}, seen["listeners"]
    assert torch.equal(received["w"], weights["w"])


def test_receiver_error_drains_remaining_buckets_then_raises():
    """Two ranks in threads of this process (a gloo group is per object): the sender must still finish."""

    weights = {f"w{i}": torch.full((1024,), float(i)) for i in range(4)}  # 4096 bytes each: one per 4096 bucket
    loaded: list[str] = []

    class Rollout:
        def update_weights(self, pairs):
            for name, t in pairs:
                if name == "w1":
                    raise KeyError("no parameter 'w1'")
                assert torch.equal(t, weights[name])
                loaded.append(name)

    results: dict = {}
    sender, receiver, thread = _sender_thread(
        lambda engine: results.update(
            sender=engine.sync(SimpleNamespace(iter_weights=lambda: iter(weights.items())), None)
        )
    )
    with pytest.raises(KeyError, match="w1"):
        receiver.sync(None, Rollout())
    thread.join(timeout=30)
    assert loaded == ["w0"]  # nothing is loaded after the failing bucket
    assert results["sender"]["buckets"] == 4 and results["sender"]["tensors"] == 4
    assert results["sender"]["bytes"] == 4 * 4096
    receiver.close()
    sender.close()


def test_a_refused_manifest_loads_nothing_and_the_sender_finishes():
    """The sender announces the update's names and shapes first; a receiver whose rollout refuses them loads
    no bucket, drains the rest and raises; the sender and the group stay usable."""

    from verl.engines.weight_sync.colocated import WeightCheckError

    weights = {f"w{i}": torch.full((1024,), float(i)) for i in range(3)}
    loaded: list[str] = []

    class Trainer:
        def iter_weights(self):
            return iter(weights.items())

        def weight_manifest(self):
            return [(n, tuple(t.shape)) for n, t in weights.items()]

    class Rollout:
        expected = {"w0": (1024,), "w1": (512,), "w2": (1024,)}  # w1 has another shape here

        def check_weights(self, specs):
            for name, shape in specs:
                if self.expected[name] != shape:
                    raise ValueError(
                        f"update_weights: {name!r} has shape {shape}, the rollout expects {self.expected[name]}"
                    )

        def update_weights(self, pairs):
            loaded.extend(name for name, _ in pairs)

    results: dict = {}
    sender, receiver, thread = _sender_thread(
        lambda engine: results.update(first=engine.sync(Trainer(), None), second=engine.sync(Trainer(), None))
    )
    with pytest.raises(WeightCheckError, match="refused before writing anything.*'w1' has shape \\(1024,\\)"):
        receiver.sync(None, Rollout())
    assert loaded == []
    Rollout.expected["w1"] = (1024,)
    assert receiver.sync(None, Rollout())["tensors"] == 3
    thread.join(timeout=30)
    assert loaded == ["w0", "w1", "w2"] and results["first"]["buckets"] == results["second"]["buckets"] == 3
    receiver.close()
    sender.close()


# ---------------------------------------------------------------- 3-process gloo sync


def _greedy(rollout, tok):
    from verl.protocol import DataProto

    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    data = DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, meta_info={"validate": True}
    )
    return rollout.generate(data).batch["responses"].clone()


def _worker(args: dict) -> None:
    from verl.engines.reference.rollout import HFRolloutEngine
    from verl.models import load_tokenizer

    torch.set_num_threads(1)
    rank, out = args["rank"], Path(args["out"])
    tok = load_tokenizer(args["model_dir"])
    cfg = SimpleNamespace(response_length=8)
    engine = BroadcastCheckpointEngine(engine_config(), FakePlatform(), options=sync_options())
    result: dict = {}
    if rank == 0:
        from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine

        trainer = ReferenceTrainingEngine(args["model_dir"], EngineSettings())
        gen = torch.Generator().manual_seed(123)
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
        result["state"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        result["responses"] = _greedy(HFRolloutEngine(trainer.model, tok, cfg), tok)
        engine.init_group(master_addr="127.0.0.1", master_port=args["port"], rank=0, world_size=3, timeout_s=60)
        result["metrics"] = engine.sync(trainer, None)

        def failing():
            for i, pair in enumerate(trainer.iter_weights()):
                if i == 3:
                    raise RuntimeError("boom at tensor 3")
                yield pair

        try:
            engine.sync(SimpleNamespace(iter_weights=failing), None)
        except RuntimeError as exc:
            result["abort"] = str(exc)
    else:
        rollout = HFRolloutEngine(args["model_dir"], tok, cfg)
        result["responses_before"] = _greedy(rollout, tok)
        engine.init_group(master_addr="127.0.0.1", master_port=args["port"], rank=rank, world_size=3, timeout_s=60)
        result["metrics"] = engine.sync(None, rollout)
        result["state"] = {k: v.clone() for k, v in rollout.model.state_dict().items()}
        result["responses"] = _greedy(rollout, tok)
        try:
            engine.sync(None, rollout)
        except WeightSyncAbortedError as exc:
            result["abort"] = str(exc)
    engine.close()
    torch.save(result, out / f"rank{rank}.pt")


@pytest.mark.multiprocess
def test_three_process_gloo_sync_matches_sender(tmp_path):
    from verl.testing.tiny import make_tiny_model, save_tiny_model

    model_dir = save_tiny_model(tmp_path / "model", hidden_size=HIDDEN)
    original = make_tiny_model(hidden_size=HIDDEN).state_dict()  # same seed as the saved folder
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    start = time.perf_counter()
    for rank in range(3):
        args = {"rank": rank, "port": port, "out": str(tmp_path), "model_dir": str(model_dir)}
        cmd = [sys.executable, __file__, "worker", json.dumps(args)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for rank, proc in enumerate(procs):
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"rank {rank} did not finish within 120 s")
        assert proc.returncode == 0, f"rank {rank} failed:\n{output}"
    print(f"3-process sync: {time.perf_counter() - start:.1f} s")

    sender = torch.load(tmp_path / "rank0.pt")
    expected_bytes = 4 * sum(t.numel() for t in original.values())
    # Hand-derived layout for 8192-byte buckets over the state-dict order (see the module constant):
    # [embed] [q0 k0 v0] [o0] [gate0] [up0] [down0] [ln0 ln0' q1 k1] [v1 o1] [gate1] [up1] [down1] [ln1 ln1' norm] [lm_head]
    assert sender["metrics"]["buckets"] == 13
    assert sender["metrics"]["tensors"] == 21 and sender["metrics"]["bytes"] == expected_bytes
    assert sender["abort"] == "boom at tensor 3"
    for name, t in original.items():
        assert not torch.equal(sender["state"][name], t), f"{name} was not perturbed"
    for rank in (1, 2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert {k: got["metrics"][k] for k in ("tensors", "bytes", "buckets")} == {
            "tensors": 21,
            "bytes": expected_bytes,
            "buckets": 13,
        }
        assert got["state"].keys() == sender["state"].keys()
        for name, t in sender["state"].items():
            assert torch.equal(got["state"][name], t), f"rank {rank}: {name} differs from the sender"
        assert not torch.equal(got["responses_before"], sender["responses"])
        assert torch.equal(got["responses"], sender["responses"])
        assert "sender (trainer rank 0) failed" in got["abort"]


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "worker":
    _worker(json.loads(sys.argv[2]))
