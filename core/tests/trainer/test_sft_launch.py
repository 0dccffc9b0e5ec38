"""``verl sft`` on one node starts its ranks itself: torchrun's environment, a loopback rendezvous (issue #36), and
the first failing rank's exit code."""

from __future__ import annotations

import pytest

from verl.trainer import sft_ranks


def test_rank_environments_are_torchruns_with_a_loopback_rendezvous(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # a user's choice is kept (not overridden in the ranks' env)
    envs = sft_ranks.rank_environments(3, 29123)
    assert sorted(envs) == [0, 1, 2]
    for rank, env in envs.items():
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("3", "3", "0")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29123")
        assert env["GLOO_SOCKET_IFNAME"] == "lo" and "NCCL_SOCKET_IFNAME" not in env
        # no torchrun agent store: rank 0 hosts the store itself (join_default_group's loopback path)
        assert "TORCHELASTIC_USE_AGENT_STORE" not in env


@pytest.mark.multiprocess
def test_a_failing_rank_stops_the_launch_with_its_exit_code(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    assert sft_ranks.launch_ranks(2, ["no_such_key=1"]) == 2  # the SFT trainer's config-error exit code
    assert "unknown config key 'no_such_key'" in capfd.readouterr().err
