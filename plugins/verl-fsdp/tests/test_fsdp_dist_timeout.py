"""``ensure_process_group`` passes ``actor_rollout_ref.nccl_timeout`` as the group's timeout."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from verl_fsdp import dist as fsdp_dist


@pytest.mark.parametrize(("timeout_s", "expected"), [(77, {"timeout": datetime.timedelta(seconds=77)}), (None, {})])
def test_env_rendezvous_gets_the_timeout(monkeypatch, timeout_s, expected) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998"}.items():
        monkeypatch.setenv(name, value)
    calls: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    assert fsdp_dist.ensure_process_group("gloo", timeout_s=timeout_s) is True
    assert calls == [{"backend": "gloo", "init_method": "env://", **expected}]
