"""``ensure_process_group`` passes ``actor_rollout_ref.nccl_timeout`` as the group's timeout, over a store at
``MASTER_ADDR`` (rank 0 hosts it, listening on that address only)."""

from __future__ import annotations

import datetime
import os

import pytest
import torch.distributed as dist
from verl_fsdp import dist as fsdp_dist

from verl.platform import network


@pytest.mark.parametrize(
    ("timeout_s", "expected", "store_timeout"),
    [(77, {"timeout": datetime.timedelta(seconds=77)}, 77.0), (None, {}, 300.0)],
)
def test_env_rendezvous_gets_the_timeout(monkeypatch, timeout_s, expected, store_timeout) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    calls: list[dict] = []
    stores: list[tuple] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(
        network, "tcp_store", lambda host, port, world, **kw: stores.append((host, port, world, kw)) or "STORE"
    )
    assert fsdp_dist.ensure_process_group("gloo", timeout_s=timeout_s) is True
    assert stores == [("127.0.0.1", 29998, 2, {"is_master": True, "timeout_s": store_timeout})]
    assert calls == [{"backend": "gloo", "store": "STORE", "rank": 0, "world_size": 2, **expected}]


def test_torchrun_agent_store_is_joined_with_env(monkeypatch) -> None:
    """Under torchrun the agent already serves the store on MASTER_PORT: the ranks join it (env://)."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in {**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    calls: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    assert fsdp_dist.ensure_process_group("gloo", timeout_s=5) is True
    assert calls == [{"backend": "gloo", "init_method": "env://", "timeout": datetime.timedelta(seconds=5)}]
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"  # every rank on this node (LOCAL_WORLD_SIZE == WORLD_SIZE)
