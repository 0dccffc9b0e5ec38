"""Worker identity: environment, in-process assignment, explicit arguments."""

from __future__ import annotations

import pytest

from verl.controller import DistGlobalInfo, DistRankInfo, Worker, WorkerMeta
from verl.controller.worker import assigned_identity

_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def clean_env(monkeypatch):
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_defaults_without_env_are_single_process(clean_env):
    w = Worker()
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size) == (0, 1, 0, 1)
    assert w.get_master_addr_port() == (None, None)


def test_identity_from_env(clean_env):
    for var, value in zip(_VARS, ("3", "4", "1", "2", "10.0.0.1", "29500"), strict=True):
        clean_env.setenv(var, value)
    w = Worker()
    assert w.meta == WorkerMeta(3, 4, 1, 2, "10.0.0.1", 29500)
    assert w.get_master_addr_port() == ("10.0.0.1", 29500)


def test_env_errors_name_the_variable(clean_env):
    clean_env.setenv("RANK", "two")
    with pytest.raises(ValueError, match=r"environment variable RANK='two' is not an integer"):
        Worker()
    clean_env.setenv("RANK", "2")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"rank=2 is outside \[0, world_size=2\)"):
        Worker()


def test_to_env_round_trips():
    meta = WorkerMeta(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="h", master_port=1234)
    assert meta.to_env() == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1234",
    }
    assert WorkerMeta.from_env(meta.to_env()) == meta
    assert WorkerMeta().to_env() == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def test_meta_validation():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        WorkerMeta(world_size=0)
    with pytest.raises(TypeError, match="rank must be an int"):
        WorkerMeta(rank="0")
    with pytest.raises(ValueError, match="not a TCP port"):
        WorkerMeta(master_port=70000)


class Configured(Worker):
    def __init__(self, config):
        # rank is already known before super().__init__ (set in __new__)
        self.rank_seen_in_init = self.rank
        self.config = config


def test_assigned_identity_beats_env_and_is_visible_in_subclass_init(clean_env):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    with assigned_identity(WorkerMeta(rank=2, world_size=3)):
        w = Configured({"lr": 1})
    assert (w.rank, w.world_size, w.rank_seen_in_init, w.config) == (2, 3, 2, {"lr": 1})
    assert Configured(None).rank == 0  # outside the block: env again


def test_explicit_arguments_override(clean_env):
    w = Worker(rank=1, world_size=2, master_port=1)
    assert (w.rank, w.world_size, w.get_master_addr_port()) == (1, 2, (None, 1))
    with pytest.raises(ValueError, match=r"rank=1 is outside \[0, world_size=1\)"):
        Worker(rank=1)


def test_dist_info_defaults():
    assert DistRankInfo() == DistRankInfo(tp_rank=0, dp_rank=0, pp_rank=0, cp_rank=0)
    assert DistGlobalInfo(dp_size=4).dp_size == 4
