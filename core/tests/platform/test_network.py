"""Where verl's own listening sockets bind (issue #36): loopback unless the group spans nodes.

torch's ``TCPStore`` server listens on every interface whatever host it is given; these tests show that (so they
can fail) and that :mod:`verl.platform.network` binds exactly the address asked for.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

from verl.platform import network
from verl.testing.sockets import WILDCARD_HOSTS, listening_addresses

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads listeners from Linux's /proc")


def _listeners_on(port: int) -> list[str]:
    return [host for host, p in listening_addresses() if p == port]


def test_the_listener_probe_sees_a_wildcard_and_a_loopback_socket():
    """The probe itself, on sockets whose addresses are known: one on every interface, one on loopback."""
    with network.bound_listener("0.0.0.0") as everywhere, network.bound_listener("127.0.0.1") as local:
        assert _listeners_on(everywhere.getsockname()[1]) == ["0.0.0.0"]
        assert _listeners_on(local.getsockname()[1]) == ["127.0.0.1"]


def test_torch_tcpstore_alone_listens_on_every_interface():
    """Why the store's socket is made here: given host 127.0.0.1, torch's own server still binds the wildcard."""
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    hosts = _listeners_on(store.port)
    assert hosts and set(hosts) <= WILDCARD_HOSTS, hosts
    del store


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_tcp_store_listens_on_the_given_address_only_and_serves_clients(host):
    if host == "::1" and not os.path.exists("/proc/net/tcp6"):
        pytest.skip("no IPv6 in this kernel (no /proc/net/tcp6)")
    try:
        master = network.tcp_store(host, 0, 2, is_master=True, timeout_s=10)
    except OSError as exc:
        pytest.skip(f"cannot bind {host} here: {exc}")
    assert _listeners_on(master.port) == [host]
    client = network.tcp_store(host, master.port, 2, is_master=False, timeout_s=10)
    client.set("key", "value")
    assert master.get("key") == b"value"


def test_listen_host_and_loopback_names():
    assert network.listen_host(False, "10.1.2.3") == "127.0.0.1"
    assert network.listen_host(True, "10.1.2.3") == "10.1.2.3"
    assert [network.is_loopback(h) for h in ("127.0.0.1", "127.3.0.9", "::1", "localhost")] == [True] * 4
    assert [network.is_loopback(h) for h in ("10.0.0.1", "0.0.0.0", "::", "node-3")] == [False] * 4


def test_loopback_env_leaves_a_users_choice_alone(monkeypatch):
    monkeypatch.delenv(network.GLOO_IFNAME, raising=False)
    monkeypatch.setenv(network.NCCL_IFNAME, "ib0")
    assert network.loopback_collective_env(nccl=True) == {network.GLOO_IFNAME: network.loopback_interface()}
    assert network.loopback_interface() == "lo"  # Linux's name (this module is skipped elsewhere)


_RANK = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from verl.platform.network import join_default_group
    from verl.testing.sockets import listening_addresses

    created = join_default_group("gloo", 60)
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    listeners = listening_addresses()  # while the group is up: the store (rank 0) and Gloo's pair sockets
    dist.barrier()
    print(json.dumps({"created": created, "sum": total.item(), "listeners": listeners,
                      "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}))
    dist.destroy_process_group()
    """
)


def _run_ranks(world: int, extra_env: dict[str, str]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK],
            env={**env, **extra_env, "RANK": str(rank), "WORLD_SIZE": str(world)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_a_two_rank_group_on_one_node_listens_on_loopback_only():
    """Two processes join through MASTER_ADDR=127.0.0.1: rank 0's store and both ranks' Gloo sockets are on loopback
    (torch's own env:// rendezvous would put the store on every interface), and the collective works."""
    port = network.free_port()
    results = _run_ranks(2, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert [r["sum"] for r in results] == [3.0, 3.0]  # 1 + 2 on both ranks
    assert all(r["created"] for r in results)
    assert [r["gloo_ifname"] for r in results] == ["lo", "lo"]
    rank0_ports = {p for _, p in results[0]["listeners"]}
    assert port in rank0_ports  # the store itself is among the listeners checked
    for result in results:
        assert result["listeners"], result
        assert {host for host, _ in result["listeners"]} == {"127.0.0.1"}, result["listeners"]


def test_a_lone_process_gets_a_one_rank_group_on_loopback():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.pop("GLOO_SOCKET_IFNAME", None)
    done = subprocess.run([sys.executable, "-c", _RANK], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sum"] == 1.0 and result["gloo_ifname"] == "lo"
    assert {host for host, _ in result["listeners"]} <= {"127.0.0.1"}


def test_half_configured_rendezvous_names_the_missing_variables(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(RuntimeError, match=r"half configured: \['RANK', 'MASTER_ADDR'\] set but \['WORLD_SIZE', "):
        network.join_default_group("gloo", owner="test")
