"""``actor_rollout_ref.nccl_timeout`` is the workers' torch.distributed process-group timeout (verl's fsdp_workers)."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from verl.config import load_config
from verl.platform import network
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker


def test_worker_joins_the_group_with_nccl_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    calls: list[dict] = []
    stores: list[tuple] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    # Rank 1 would connect to rank 0's store: record where instead (the store's binding has its own tests).
    monkeypatch.setattr(
        network, "tcp_store", lambda host, port, world, **kw: stores.append((host, port, world, kw)) or "STORE"
    )
    # The world comes from the environment (as under Ray); a one-worker config needs no FSDP plugin installed.
    cfg = load_config(overrides=["actor_rollout_ref.nccl_timeout=1234"])
    worker = ActorRolloutRefWorker(cfg, role="actor")
    worker._init_process_group(type("P", (), {"dist_backend": "gloo"})())
    assert stores == [("127.0.0.1", 29999, 2, {"is_master": False, "timeout_s": 1234.0})]
    assert calls == [
        {
            "backend": "gloo",
            "store": "STORE",
            "rank": 1,
            "world_size": 2,
            "timeout": datetime.timedelta(seconds=1234),
        }
    ]
