"""RayWorkerGroup: same results as LocalWorkerGroup, rank env + gloo, errors, colocation, futures, placement."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from verl.controller import (  # noqa: E402
    ClassWithInitArgs,
    Dispatch,
    Execute,
    LocalWorkerGroup,
    Worker,
    WorkerError,
    WorkerFuture,
    create_colocated_worker_cls,
    register,
)
from verl.controller.ray import PlacementError, RayResourcePool, RayWorkerGroup, init_ray  # noqa: E402
from verl.controller.ray.worker_group import rendezvous_address  # noqa: E402
from verl.protocol import DataProto  # noqa: E402

pytestmark = pytest.mark.multiprocess

# pytest imports this file under a module name the Ray workers cannot import: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Probe(Worker):
    def __init__(self, k):
        self.k = k

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def scale(self, x):
        return x * (self.rank + 1) + self.k

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def pair(self, a, b):
        return (self.rank, a, b)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self):
        return (self.rank, self.world_size)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def square(self, x):
        return x * x + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def shift(self, data):
        out = DataProto.from_dict(
            tensors={"x": data.batch["x"] + 10 * self.rank},
            non_tensors={"tag": data.non_tensor_batch["tag"], "who": np.full(len(data), self.rank)},
        )
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def total(self, data):
        return {"sum": int(data.batch["x"].sum()), "rows": len(data)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self):
        keys = (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "VERL_TEST_JOB_VAR",
            "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME",
        )
        return {key: os.environ.get(key) for key in keys}, (self.rank, self.world_size, self.get_master_addr_port())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def allreduce(self):
        import torch.distributed as dist

        from verl.platform.network import join_default_group
        from verl.testing.sockets import listening_addresses

        before = set(listening_addresses())  # Ray's own servers in this worker process (docs/ray.md)
        join_default_group("gloo", 60)
        try:
            t = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(t)
            hosts = sorted({host for host, _ in set(listening_addresses()) - before})
            dist.barrier()
            return t.item(), dist.get_rank(), dist.get_world_size(), hosts
        finally:
            dist.destroy_process_group()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, bad_rank):
        if bad_rank in (self.rank, "all"):
            raise KeyError(f"boom on {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def slow(self, x, seconds):
        time.sleep(seconds)
        return x + self.rank

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def pid(self):
        return os.getpid()


class Mortal(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on(self, rank, others_sleep=0.0):
        if self.rank == rank:
            os._exit(1)
        time.sleep(others_sleep)
        return self.rank


class PeerOfTheDead(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def collective(self):
        # Rank 1's process dies; rank 0's collective then fails, as gloo does after a peer vanished.
        if self.rank == 1:
            os._exit(1)
        time.sleep(0.5)
        raise RuntimeError("Connection reset by peer")


class BrokenInit(Worker):
    def __init__(self):
        if self.rank == 1:
            raise ValueError("no model on rank 1")


class Actor(Worker):
    def __init__(self, lr):
        self.lr = lr
        self.steps = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return f"actor{self.rank}/{self.world_size} lr={self.lr}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update(self):
        self.steps += 1
        return self.steps

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()


class Ref(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return f"ref{self.rank}"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref(self, data):
        return DataProto.from_dict(tensors={"ref": data.batch["x"] * -2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def ping(self):
        await asyncio.sleep(0)
        return f"pong{self.rank}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()


def small_pool(n=2):
    # Half a CPU per worker: two groups of two fit in the 2-CPU test cluster at once.
    return RayResourcePool([n], cpus_per_worker=0.5)


def batch(n):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n)}, non_tensors={"tag": np.array([chr(ord("a") + i) for i in range(n)])}
    )


@pytest.fixture(scope="module")
def ray_runtime():
    init_ray({"num_cpus": 2, "runtime_env": {"env_vars": {"VERL_TEST_JOB_VAR": "on"}}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def groups(ray_runtime):
    init = ClassWithInitArgs(Probe, 10)
    wg = RayWorkerGroup(small_pool(), init)
    yield wg, LocalWorkerGroup(init, world_size=2)
    wg.shutdown()


def assert_same_proto(a, b):
    assert len(a) == len(b) and set(a.batch.keys()) == set(b.batch.keys())
    for key in a.batch.keys():
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for key in a.non_tensor_batch:
        np.testing.assert_array_equal(a.non_tensor_batch[key], b.non_tensor_batch[key])


# ---- dispatch parity -----------------------------------------------------------------------------


def test_simple_modes_match_local_and_hand_values(groups):
    wg, local = groups
    # scale: x * (rank + 1) + k with k=10, x=3 -> [13, 16]
    assert wg.scale(3) == local.scale(3) == [13, 16]
    # every argument a per-rank list -> scattered; otherwise broadcast
    assert wg.pair([1, 2], [3, 4]) == local.pair([1, 2], [3, 4]) == [(0, 1, 3), (1, 2, 4)]
    assert wg.pair(1, [3, 4]) == local.pair(1, [3, 4]) == [(0, 1, [3, 4]), (1, 1, [3, 4])]
    assert wg.whoami() == local.whoami() == (0, 2)
    # square: x*x + rank -> [2*2 + 0, 3*3 + 1]
    assert wg.square([2, 3]) == local.square([2, 3]) == [4, 10]
    assert wg.execute_all("scale", 1) == [11, 12]
    assert wg.execute_rank_zero("scale", 1) == 11


@pytest.mark.parametrize("rows", [4, 5])
def test_dp_compute_proto_matches_local_with_and_without_padding(groups, rows):
    wg, local = groups
    out, expected_local = wg.shift(batch(rows)), local.shift(batch(rows))
    # rows split in halves (5 rows: padded to 6 with row 0, the pad row dropped); rank 1 adds 10
    half = (rows + 1) // 2
    expected_x = [i if i < half else i + 10 for i in range(rows)]
    assert out.batch["x"].tolist() == expected_x
    assert out.non_tensor_batch["who"].tolist() == [0] * half + [1] * (rows - half)
    assert out.non_tensor_batch["tag"].tolist() == list("abcde"[:rows])
    assert_same_proto(out, expected_local)


def test_dp_compute_metric_matches_local(groups):
    wg, local = groups
    # 5 rows padded to 6: rank 0 gets x=[0,1,2], rank 1 gets x=[3,4,0] (pad row = row 0)
    assert wg.total(batch(5)) == local.total(batch(5)) == [{"sum": 3, "rows": 3}, {"sum": 7, "rows": 3}]


def test_unknown_method_raises_attribute_error_naming_registered_methods(groups):
    wg, _ = groups
    with pytest.raises(AttributeError, match=r"no method 'nope'.*registered methods: .*scale"):
        wg.execute_all("nope")


# ---- identity and torch.distributed ----------------------------------------------------------------


def test_workers_see_rank_env_and_master_address(groups):
    wg, _ = groups
    (env0, id0), (env1, id1) = wg.env()
    assert (env0["RANK"], env1["RANK"]) == ("0", "1")
    assert {env0["WORLD_SIZE"], env1["WORLD_SIZE"], env0["LOCAL_WORLD_SIZE"]} == {"2"}
    assert (env0["LOCAL_RANK"], env1["LOCAL_RANK"]) == ("0", "1")
    assert env0["VERL_TEST_JOB_VAR"] == env1["VERL_TEST_JOB_VAR"] == "on"  # job env merged with the rank env
    # A group on one node rendezvouses on loopback; on a one-node cluster Gloo's and NCCL's sockets use it too.
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"] == wg.master_addr == "127.0.0.1"
    assert (env0["GLOO_SOCKET_IFNAME"], env0["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    assert len(wg.node_ids) == 1
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"] == str(wg.master_port)
    assert id0 == (0, 2, (wg.master_addr, wg.master_port)) and id1[:2] == (1, 2)
    assert wg.pid() != os.getpid()  # rank 0 is a separate process


def test_gloo_process_group_and_all_reduce(groups):
    wg, _ = groups
    # all_reduce(sum) of rank + 1 over ranks 0, 1 = 1 + 2 = 3 on every rank
    # every socket the group opened to listen on (rank 0's store, Gloo's pairs) is on loopback: it is on one node
    results = wg.execute_all_async("allreduce").get(timeout=120)
    assert [r[:3] for r in results] == [(3.0, 0, 2), (3.0, 1, 2)]
    assert [r[3] for r in results] == [["127.0.0.1"], ["127.0.0.1"]]


def test_rendezvous_probe_task_on_the_bundle_node_agrees(groups):
    wg, _ = groups
    addr, port = rendezvous_address(wg.resource_pool.get_placement_groups(), force_remote=True)
    assert addr == wg.master_addr and isinstance(port, int) and 0 < port < 65536


# ---- errors ------------------------------------------------------------------------------------------


def test_worker_exception_becomes_worker_error_with_original_cause(groups):
    wg, local = groups
    with pytest.raises(WorkerError) as info:
        wg.fail_on(1)
    err = info.value
    assert (err.worker_class, err.rank, err.method_name, err.failed_ranks) == ("Probe", 1, "fail_on", (1,))
    assert "Probe.fail_on failed on rank 1 of world size 2" in str(err) and "KeyError" in str(err)
    assert type(err.__cause__) is KeyError and err.__cause__.args == ("boom on 1",)
    with pytest.raises(WorkerError) as both:
        wg.fail_on("all")
    with pytest.raises(WorkerError) as both_local:
        local.fail_on("all")
    assert (both.value.rank, both.value.failed_ranks) == (both_local.value.rank, both_local.value.failed_ranks)
    assert both.value.failed_ranks == (0, 1)
    assert wg.scale(0) == [10, 10]  # the group stays usable after a user exception


def test_non_blocking_method_returns_future_and_timeout_names_method(groups):
    wg, local = groups
    future = wg.slow(5, 1.0)
    assert isinstance(future, WorkerFuture) and not future.done()
    with pytest.raises(TimeoutError, match=r"Probe\.slow did not finish within 0\.05 s"):
        future.get(timeout=0.05)
    assert future.get(timeout=60) == local.slow(5, 0.0).get() == [5, 6]
    assert future.done()


def test_dead_worker_process_becomes_worker_error_saying_it_died(ray_runtime):
    pool = small_pool()
    with RayWorkerGroup(pool, ClassWithInitArgs(Mortal)) as wg:
        with pytest.raises(ValueError, match="max_colocate_count"):  # one group per bundle by default
            RayWorkerGroup(pool, ClassWithInitArgs(Mortal))
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            # rank 0 stays busy for 8 s: the failure is reported after the 2 s grace, without rank 0
            wg.execute_all_async("die_on", 1, others_sleep=8.0).get(timeout=60)
        assert time.monotonic() - start < 7
        err = info.value
        assert (err.worker_class, err.rank, err.method_name, err.failed_ranks) == ("Mortal", 1, "die_on", (1,))
        assert "died" in str(err) and "Mortal.die_on failed on rank 1" in str(err)
        assert isinstance(err.__cause__.__cause__, ray.exceptions.RayActorError)
    assert wg.workers == [] and pool._pgs is None
    with pytest.raises(RuntimeError, match="shut down"):
        wg.die_on(0)


def test_dead_rank_is_reported_before_the_survivors_follow_up_errors(ray_runtime):
    with RayWorkerGroup(small_pool(), ClassWithInitArgs(PeerOfTheDead)) as wg, pytest.raises(WorkerError) as info:
        wg.collective()
    err = info.value
    assert (err.rank, err.method_name, err.failed_ranks) == (1, "collective", (0, 1))
    assert "failed on rank 1" in str(err) and "died" in str(err) and "ranks [0] failed as well" in str(err)


def test_constructor_failure_is_a_worker_error_for_init(ray_runtime):
    pool = small_pool()
    with pytest.raises(WorkerError) as info:
        RayWorkerGroup(pool, ClassWithInitArgs(BrokenInit))
    assert (info.value.rank, info.value.method_name) == (1, "__init__")
    assert "no model on rank 1" in str(info.value) and "constructor raised" in str(info.value)
    assert pool._pgs is None  # the failed group gave its placement group back


# ---- colocation ------------------------------------------------------------------------------------------


def test_colocated_roles_share_a_process_and_spawn_views_work(ray_runtime):
    cls = create_colocated_worker_cls({"actor": ClassWithInitArgs(Actor, lr=0.1), "ref": ClassWithInitArgs(Ref)})
    local = LocalWorkerGroup(cls, world_size=2).spawn(["actor", "ref"])
    with RayWorkerGroup(small_pool(), cls) as wg:
        views = wg.spawn(["actor", "ref"])
        assert views["actor"].init_model() == local["actor"].init_model() == ["actor0/2 lr=0.1", "actor1/2 lr=0.1"]
        assert views["ref"].init_model() == ["ref0", "ref1"]
        assert views["ref"].ping() == ["pong0", "pong1"]  # async method: the actor is an async actor
        assert views["actor"].update() == [1, 1] and views["actor"].update() == [2, 2]
        assert views["actor"].pid() == views["ref"].pid()  # both roles of a rank in one process
        out = views["ref"].compute_ref(batch(3))  # 3 rows padded to 4: ref = -2 * x, pad dropped
        assert out.batch["ref"].tolist() == [0, -2, -4]
        assert_same_proto(out, local["ref"].compute_ref(batch(3)))


# ---- placement -------------------------------------------------------------------------------------------


def test_a_pool_larger_than_any_machine_fails_at_once_with_the_fix(ray_runtime):
    pool = RayResourcePool([3], cpus_per_worker=1.0, placement_timeout_s=60)
    start = time.monotonic()
    with pytest.raises(PlacementError) as info:
        RayWorkerGroup(pool, ClassWithInitArgs(Probe, 0))
    assert time.monotonic() - start < 5  # not the 60 s timeout: it can never fit
    message = str(info.value)
    assert (
        "can never be placed: node 0 needs {'CPU': 3.0} on one machine, the largest machine has {'CPU': 2.0}" in message
    )
    assert "+ray_kwargs.ray_init.num_cpus=3" in message
    assert pool._pgs is None


def test_placement_blocked_by_busy_resources_times_out_with_requested_and_available(ray_runtime):
    import ray

    free = int(ray.available_resources().get("CPU", 0.0))  # other tests' groups may hold some
    if free < 1:
        pytest.skip("no free CPU in the test cluster to occupy")
    holder = RayResourcePool([free], cpus_per_worker=1.0)
    holder.get_placement_groups()
    try:
        pool = RayResourcePool([1], cpus_per_worker=1.0, placement_timeout_s=0.5)
        with pytest.raises(PlacementError) as info:
            pool.get_placement_groups()
        message = str(info.value)
        assert "1 x {'CPU': 1.0}" in message and "total {'CPU': 2.0}" in message and "available {'CPU': 0.0}" in message
        assert pool._pgs is None
    finally:
        holder.remove_placement_groups()


def test_pool_bundles_and_actor_resources_follow_the_platform():
    from verl.platform.cuda import CudaPlatform

    pool = RayResourcePool([2, 2], cpus_per_worker=2.0, max_colocate_count=2)
    assert pool.world_size == 4 and pool.bundle() == {"CPU": 4.0}
    assert pool.actor_options() == {"num_cpus": 2.0}
    assert pool.layout() == [(0, 0, 0, 2), (0, 1, 1, 2), (1, 0, 0, 2), (1, 1, 1, 2)]
    gpu_pool = RayResourcePool([2], platform=CudaPlatform(), cpus_per_worker=2.0, max_colocate_count=2)
    # a bundle: 1 GPU + cpus_per_worker * max_colocate_count CPUs; an actor: half the GPU, 2 CPUs
    assert gpu_pool.bundle() == {"GPU": 1.0, "CPU": 4.0}
    assert gpu_pool.actor_options() == {"num_cpus": 2.0, "num_gpus": 0.5}
    with pytest.raises(ValueError, match=r"process_on_nodes\[1\]=0"):
        RayResourcePool([2, 0])
    with pytest.raises(ValueError, match="cpus_per_worker"):
        RayResourcePool([1], cpus_per_worker=0)


# ---- init_ray ----------------------------------------------------------------------------------------------


@pytest.fixture
def captured_init(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    for name in ("RAY_ADDRESS", "OMP_NUM_THREADS", "VERL_PLUGINS", "PYTHONPATH", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_init_ray_joins_the_cluster_named_by_ray_address(captured_init, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    init_ray({"runtime_env": {"env_vars": {"MY_FLAG": 1}}, "namespace": "verl"})
    (kwargs,) = captured_init
    assert kwargs["address"] == "10.0.0.1:6379" and kwargs["namespace"] == "verl"
    assert not {"num_cpus", "object_store_memory", "include_dashboard"} & set(kwargs)
    assert kwargs["runtime_env"] == {"env_vars": {"OMP_NUM_THREADS": "3", "MY_FLAG": "1"}}


def test_init_ray_starts_a_small_local_cluster_with_overrides(captured_init):
    init_ray({"num_cpus": 1})
    (kwargs,) = captured_init
    assert kwargs["num_cpus"] == 1 and kwargs["include_dashboard"] is False
    assert kwargs["object_store_memory"] == 256 * 1024 * 1024 and kwargs["log_to_driver"] is True
    assert "address" not in kwargs and "runtime_env" not in kwargs  # no driver variable set, none propagated
    captured_init.clear()
    init_ray()
    assert captured_init[0]["num_cpus"] == os.cpu_count()


def test_init_ray_address_local_starts_a_cluster_with_the_local_defaults(captured_init, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/src")
    init_ray({"address": "local"})
    (kwargs,) = captured_init
    assert kwargs["address"] == "local" and kwargs["num_cpus"] == os.cpu_count()
    assert kwargs["runtime_env"] == {"env_vars": {"PYTHONPATH": "/src"}}


def test_init_ray_is_a_no_op_when_ray_is_running(captured_init, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    init_ray({"num_cpus": 1})
    assert captured_init == []


def test_importing_verl_controller_does_not_import_ray():
    code = "import sys, verl, verl.controller; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
