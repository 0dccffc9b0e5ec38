"""Colocation: several roles in one worker, per-role views from spawn()."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    Worker,
    WorkerError,
    create_colocated_worker_cls,
    register,
)
from verl.protocol import DataProto


class Actor(Worker):
    def __init__(self, lr):
        self.lr = lr
        self.steps = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return f"actor{self.rank}/{self.world_size} lr={self.lr}"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            tensors={"lp": data.batch["x"] * -1.0}, non_tensors={"r": np.full(len(data), self.rank)}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update(self):
        self.steps += 1
        if self.steps > 1 and self.rank == 1:
            raise RuntimeError("second update fails on rank 1")
        return self.steps


class Ref(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        return f"ref{self.rank}"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"ref_lp": data.batch["x"] * -2.0})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def ping(self):
        return "pong"


def colocated_group(world_size=2):
    cls = create_colocated_worker_cls({"actor": ClassWithInitArgs(Actor, lr=0.1), "ref": ClassWithInitArgs(Ref)})
    return LocalWorkerGroup(cls, world_size=world_size)


def test_colocated_class_exposes_prefixed_methods():
    wg = colocated_group()
    assert wg.worker_cls.__name__ == "ColocatedWorker_actor_ref"
    assert wg.worker_cls.colocated_roles == ("actor", "ref")
    assert wg.method_names == [
        "actor_compute_log_prob",
        "actor_init_model",
        "actor_update",
        "ref_compute_ref_log_prob",
        "ref_init_model",
        "ref_ping",
    ]
    assert wg.actor_init_model() == ["actor0/2 lr=0.1", "actor1/2 lr=0.1"]


def test_roles_share_one_object_per_rank_with_the_same_identity():
    wg = colocated_group(3)
    for rank, w in enumerate(wg.workers):
        assert set(w.worker_dict) == {"actor", "ref"}
        assert [w.worker_dict[r].rank for r in ("actor", "ref")] == [rank, rank]
        assert w.worker_dict["actor"].world_size == 3


def test_spawn_views_alias_role_methods():
    wg = colocated_group()
    views = wg.spawn({"actor", "ref"})
    actor, ref = views["actor"], views["ref"]
    assert actor.world_size == 2
    assert actor.method_names == ["compute_log_prob", "init_model", "update"]
    assert actor.init_model() == ["actor0/2 lr=0.1", "actor1/2 lr=0.1"]
    assert ref.init_model() == ["ref0", "ref1"]
    assert ref.ping() == ["pong", "pong"]
    wg.shutdown()
    data = DataProto.from_dict(tensors={"x": torch.tensor([1.0, 2.0, 3.0])})
    out = actor.compute_log_prob(data)  # 3 rows on 2 ranks: padded to 4, stripped back to 3
    assert out.batch["lp"].tolist() == [-1.0, -2.0, -3.0]
    assert list(out.non_tensor_batch["r"]) == [0, 0, 1]
    assert ref.compute_ref_log_prob(data).batch["ref_lp"].tolist() == [-2.0, -4.0, -6.0]
    # views drive the same workers as the group
    assert actor.execute_all("update") == [1, 1]
    assert [w.worker_dict["actor"].steps for w in wg.workers] == [1, 1]


def test_view_errors_name_the_colocated_method():
    actor = colocated_group().spawn(["actor"])["actor"]
    actor.update()
    with pytest.raises(WorkerError, match=r"ColocatedWorker_actor_ref.actor_update failed on rank 1") as info:
        actor.update()
    assert isinstance(info.value.__cause__, RuntimeError)


def test_spawn_unknown_role_lists_the_roles():
    with pytest.raises(ValueError, match=r"no method of ColocatedWorker_actor_ref starts with 'critic_'.*actor, ref"):
        colocated_group().spawn({"critic"})


def test_create_colocated_worker_cls_validation():
    with pytest.raises(ValueError, match="at least one role"):
        create_colocated_worker_cls({})
    with pytest.raises(TypeError, match=r"role 'actor': expected ClassWithInitArgs"):
        create_colocated_worker_cls({"actor": Actor})
    with pytest.raises(ValueError, match=r"role 'actor' is a prefix of role 'actor_rollout'"):
        create_colocated_worker_cls({"actor": ClassWithInitArgs(Ref), "actor_rollout": ClassWithInitArgs(Ref)})
    with pytest.raises(ValueError, match="must be an identifier"):
        create_colocated_worker_cls({"my role": ClassWithInitArgs(Ref)})


def test_clashing_method_names_are_rejected():
    class A(Worker):
        @register()
        def x_y(self):
            return None

    class Get(Worker):
        @register()
        def master_addr_port(self):
            return None

    # role "a" method "x_y" and role "a_x" method "y" would both be "a_x_y": "a" is a prefix of "a_x".
    with pytest.raises(ValueError, match="prefix"):
        create_colocated_worker_cls({"a": ClassWithInitArgs(A), "a_x": ClassWithInitArgs(A)})
    with pytest.raises(ValueError, match="shadows a Worker attribute"):
        create_colocated_worker_cls({"get": ClassWithInitArgs(Get)})
