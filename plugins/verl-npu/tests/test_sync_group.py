"""The HCCL weight-sync group: core's ``broadcast`` engine asks the platform, and NPUPlatform builds
``ProcessGroupHCCL``. The HCCL class is a STAND-IN injected as ``torch_npu._C._distributed_c10d`` (it shows the
call order and arguments, not that HCCL connects)."""

from __future__ import annotations

import datetime
import importlib.util
import sys
import types

import pytest
import torch
import torch.distributed as dist
from verl_npu.platform import NPUPlatform

from verl.config.schema.rollout import CheckpointEngineConfig
from verl.engines.weight_sync import BroadcastCheckpointEngine, UnsupportedBackendError, free_port


class StandInProcessGroupHCCL:
    """Stand-in for torch_npu's ``ProcessGroupHCCL``: records its construction and shutdown."""

    made: list[StandInProcessGroupHCCL] = []

    class Options:
        def __init__(self):
            self._timeout = None

    def __init__(self, store, rank, size, options):
        self.store, self.rank, self.size, self.options = store, rank, size, options
        self.shut = False
        StandInProcessGroupHCCL.made.append(self)

    def shutdown(self):
        self.shut = True


@pytest.fixture
def stand_in_hccl(monkeypatch):
    StandInProcessGroupHCCL.made = []
    c10d = types.ModuleType("torch_npu._C._distributed_c10d")
    c10d.ProcessGroupHCCL = StandInProcessGroupHCCL
    c = types.ModuleType("torch_npu._C")
    c._distributed_c10d = c10d
    pkg = types.ModuleType("torch_npu")
    pkg._C = c
    for name, module in (("torch_npu", pkg), ("torch_npu._C", c), ("torch_npu._C._distributed_c10d", c10d)):
        monkeypatch.setitem(sys.modules, name, module)
    return StandInProcessGroupHCCL


def test_stand_in_new_sync_group_builds_process_group_hccl(stand_in_hccl):
    store = dist.HashStore()
    group = NPUPlatform().new_sync_group("hccl", store, 1, 3, 7.5)
    assert isinstance(group, stand_in_hccl) and stand_in_hccl.made == [group]
    assert (group.store, group.rank, group.size) == (store, 1, 3)
    assert group.options._timeout == datetime.timedelta(seconds=7.5)


def test_stand_in_broadcast_engine_asks_the_npu_platform(stand_in_hccl, monkeypatch):
    monkeypatch.setattr(NPUPlatform, "torch_device", lambda self, index=None: torch.device("cpu"))
    config = CheckpointEngineConfig(backend="broadcast", update_weights_bucket_megabytes=1)
    engine = BroadcastCheckpointEngine(config, NPUPlatform())
    assert engine.backend == "hccl"
    # rank 0 only hosts the store (no worker waits); the stand-in HCCL group connects nothing.
    engine.init_group(master_addr="127.0.0.1", master_port=free_port(), rank=0, world_size=2, timeout_s=5)
    (group,) = stand_in_hccl.made
    assert (group.rank, group.size, group.options._timeout) == (0, 2, datetime.timedelta(seconds=5))
    assert type(group.store).__name__ == "PrefixStore"
    engine.close()
    assert group.shut


def test_gloo_override_uses_core_gloo_on_the_npu_platform():
    # Colocated placement overrides the backend to gloo: the NPU platform builds it with core's default.
    group = NPUPlatform().new_sync_group("gloo", dist.HashStore(), 0, 1, 5.0)
    assert isinstance(group, dist.ProcessGroupGloo) and group.size() == 1


def test_nccl_is_refused_on_npu():
    with pytest.raises(
        UnsupportedBackendError, match=r"'nccl' is not supported by platform 'npu'; supported: gloo, hccl"
    ):
        NPUPlatform().check_sync_backend("nccl")


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None and hasattr(torch, "npu"), reason="torch_npu works here"
)
def test_hccl_without_a_working_torch_npu_is_a_clear_error():
    with pytest.raises(
        UnsupportedBackendError, match=r"backend 'hccl' needs torch_npu with ProcessGroupHCCL in this process"
    ):
        NPUPlatform().check_sync_backend("hccl")
    config = CheckpointEngineConfig(backend="broadcast", update_weights_bucket_megabytes=1)
    engine = BroadcastCheckpointEngine(config, NPUPlatform())
    with pytest.raises(
        UnsupportedBackendError, match=r"^broadcast checkpoint engine: sync group: backend 'hccl' needs"
    ):
        engine.init_group(master_addr="127.0.0.1", master_port=1, rank=0, world_size=2)
