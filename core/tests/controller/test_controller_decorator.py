"""@register attributes, the Dispatch/Execute dynamic enums and custom dispatch modes."""

from __future__ import annotations

import inspect
import pickle

import pytest

from verl.controller import (
    MAGIC_ATTR,
    ClassWithInitArgs,
    Dispatch,
    Execute,
    LocalWorkerGroup,
    Worker,
    get_predefined_dispatch_fn,
    get_register_attrs,
    register,
    register_dispatch_mode,
    registered_methods,
    unregister_dispatch_mode,
    update_dispatch_mode,
)
from verl.controller import dispatch as d


def test_magic_attr_is_verls_name_and_holds_the_three_attributes():
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def f(self):
        return 1

    assert MAGIC_ATTR == "attrs_3141562937"
    assert getattr(f, MAGIC_ATTR) == {
        "dispatch_mode": Dispatch.ONE_TO_ALL,
        "execute_mode": Execute.ALL,
        "blocking": False,
    }


def test_register_defaults_match_verl():
    @register()
    def f(self):
        return 1

    assert get_register_attrs(f) == {
        "dispatch_mode": Dispatch.ALL_TO_ALL,
        "execute_mode": Execute.ALL,
        "blocking": True,
    }
    assert get_register_attrs(lambda: 0) is None


def test_rank_zero_dispatch_implies_rank_zero_execution():
    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def f(self):
        return 1

    assert get_register_attrs(f)["execute_mode"] is Execute.RANK_ZERO


def test_enums_have_the_verl_members():
    assert Dispatch.names() == [
        "RANK_ZERO",
        "ONE_TO_ALL",
        "ALL_TO_ALL",
        "DP_COMPUTE",
        "DP_COMPUTE_PROTO",
        "DP_COMPUTE_METRIC",
    ]
    assert Execute.names() == ["ALL", "RANK_ZERO"]
    assert Dispatch["DP_COMPUTE_PROTO"] is Dispatch.DP_COMPUTE_PROTO
    assert Dispatch.ONE_TO_ALL in Dispatch and Execute.ALL not in Dispatch
    with pytest.raises(KeyError, match="unknown Dispatch 'NOPE'; known: RANK_ZERO"):
        Dispatch.from_name("NOPE")


def test_enum_members_pickle_to_the_same_singleton():
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE_PROTO)) is Dispatch.DP_COMPUTE_PROTO
    assert pickle.loads(pickle.dumps(Execute.RANK_ZERO)) is Execute.RANK_ZERO


def test_register_rejects_bad_arguments():
    with pytest.raises(TypeError, match=r"@register must be called"):

        @register
        def f(self):
            return 1

    with pytest.raises(TypeError, match="dispatch_mode must be a Dispatch member"):
        register(dispatch_mode="ONE_TO_ALL")
    with pytest.raises(TypeError, match="execute_mode must be an Execute member"):
        register(execute_mode=Dispatch.ONE_TO_ALL)
    with pytest.raises(TypeError, match="blocking must be a bool"):
        register(blocking=1)
    with pytest.raises(
        ValueError, match=r"exactly the keys 'dispatch_fn' and 'collect_fn', got keys \['dispatch_fn'\]"
    ):
        register(dispatch_mode={"dispatch_fn": d.dispatch_one_to_all})
    with pytest.raises(TypeError, match="collect_fn must be callable"):
        register(dispatch_mode={"dispatch_fn": d.dispatch_one_to_all, "collect_fn": 3})
    with pytest.raises(ValueError, match="does not fit DP_COMPUTE_PROTO"):
        register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO)


def test_register_keeps_async_functions_async_and_preserves_metadata():
    @register()
    async def agen(self):
        """doc"""
        return 1

    assert inspect.iscoroutinefunction(agen)
    assert agen.__name__ == "agen" and agen.__doc__ == "doc"


def test_registered_methods_finds_inherited_and_skips_plain_methods():
    class Base(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self):
            return None

    class Child(Base):
        @register()
        def step(self):
            return None

        def helper(self):
            return None

    assert sorted(registered_methods(Child)) == ["init_model", "step"]


def _dispatch_sum(worker_group, *args, **kwargs):
    # custom mode: rank i gets arg * (i + 1)
    n = worker_group.world_size
    return tuple([a * (i + 1) for i in range(n)] for a in args), {}


def _collect_sum(worker_group, outputs):
    return sum(outputs)


class _Doubler(Worker):
    @register(dispatch_mode={"dispatch_fn": _dispatch_sum, "collect_fn": _collect_sum})
    def custom(self, x):
        return x + self.rank


def test_custom_dict_mode_is_used_by_the_group():
    wg = LocalWorkerGroup(ClassWithInitArgs(_Doubler), world_size=3)
    # rank i computes 2*(i+1) + i -> 2, 5, 8; collect sums them.
    assert wg.custom(2) == 15


def test_register_dispatch_mode_extends_dispatch_and_can_be_removed():
    mode = register_dispatch_mode("TEST_SUM_MODE", _dispatch_sum, _collect_sum)
    try:
        assert Dispatch.TEST_SUM_MODE is mode and mode in Dispatch
        assert get_predefined_dispatch_fn(mode) == {"dispatch_fn": _dispatch_sum, "collect_fn": _collect_sum}

        class W(Worker):
            @register(dispatch_mode=Dispatch.TEST_SUM_MODE)
            def f(self, x):
                return x

        assert LocalWorkerGroup(ClassWithInitArgs(W), world_size=2).f(5) == 5 + 10
        with pytest.raises(ValueError, match="already exists"):
            register_dispatch_mode("TEST_SUM_MODE", _dispatch_sum, _collect_sum)
        update_dispatch_mode(mode, d.dispatch_one_to_all, d.collect_all_to_all)
        assert get_predefined_dispatch_fn(mode)["collect_fn"] is d.collect_all_to_all
    finally:
        unregister_dispatch_mode("TEST_SUM_MODE")
    assert "TEST_SUM_MODE" not in Dispatch.names()
    with pytest.raises(ValueError, match="built in"):
        unregister_dispatch_mode("ONE_TO_ALL")


def test_dispatch_fn_must_return_args_kwargs_pair():
    class W(Worker):
        @register(dispatch_mode={"dispatch_fn": lambda wg, *a, **k: a, "collect_fn": d.collect_all_to_all})
        def f(self, x):
            return x

    with pytest.raises(TypeError, match=r"dispatch_fn of W.f must return \(args, kwargs\), got tuple"):
        LocalWorkerGroup(ClassWithInitArgs(W)).f(1)
