"""LocalWorkerGroup: ranks, execute_*, error wrapping, futures, async methods, argument isolation."""

from __future__ import annotations

import asyncio

import pytest

from verl.controller import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    LocalWorkerGroup,
    Worker,
    WorkerError,
    WorkerFuture,
    WorkerGroup,
    register,
)


class Counter(Worker):
    def __init__(self, start=0):
        self.value = start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x):
        self.value += x
        return self.value + 100 * self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def add_later(self, x):
        return self.add(x)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, bad_rank):
        if self.rank == bad_rank or bad_rank == "all":
            raise KeyError(f"boom on {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def fail_later(self):
        raise ValueError("late")

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def identity(self):
        return (self.rank, self.world_size, self.local_rank, self.get_master_addr_port())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def async_add(self, x):
        await asyncio.sleep(0)
        self.value += x
        return self.value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mutate(self, box):
        box.append(self.rank)
        return len(box)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def give_lambda(self):
        return lambda: 0


def make(world_size=2, **kwargs):
    return LocalWorkerGroup(ClassWithInitArgs(Counter, start=5), world_size=world_size, **kwargs)


def test_workers_get_distinct_ranks_and_init_args():
    wg = make(3, master_addr="localhost", master_port=29500)
    assert isinstance(wg, WorkerGroup) and wg.world_size == 3
    assert [(w.rank, w.world_size, w.local_rank, w.value) for w in wg.workers] == [
        (0, 3, 0, 5),
        (1, 3, 1, 5),
        (2, 3, 2, 5),
    ]
    assert wg.identity() == (0, 3, 0, ("localhost", 29500))
    assert wg.method_names == sorted(
        ["add", "add_later", "fail_on", "fail_later", "identity", "async_add", "mutate", "give_lambda"]
    )


def test_state_persists_across_calls():
    wg = make(2)
    assert wg.add(1) == [6, 106]
    assert wg.add(2) == [8, 108]


def test_execute_all_and_rank_zero():
    wg = make(2)
    assert wg.execute_all("add", 1) == [6, 106]
    assert wg.execute_all("add", [10, 20]) == [16, 126]  # one-entry-per-rank list is scattered
    assert wg.execute_rank_zero("add", 1) == 17
    assert [w.value for w in wg.workers] == [17, 26]
    assert wg.execute_all_async("add", 0).get() == [17, 126]
    assert wg.execute_rank_zero_async("add", 0).result() == 17


def test_execute_unknown_method_is_attribute_error():
    with pytest.raises(AttributeError, match=r"Counter has no method 'nope'; registered methods: add"):
        make(1).execute_all("nope")


def test_worker_exception_is_wrapped_with_class_rank_method_and_cause():
    wg = make(4)
    with pytest.raises(WorkerError) as info:
        wg.fail_on(2)
    err = info.value
    assert (err.worker_class, err.rank, err.method_name, err.world_size) == ("Counter", 2, "fail_on", 4)
    assert isinstance(err.__cause__, KeyError) and "boom on 2" in str(err.__cause__)
    assert "Counter.fail_on failed on rank 2 of world size 4: KeyError" in str(err)


def test_worker_error_reports_lowest_rank_and_lists_the_others():
    with pytest.raises(
        WorkerError, match=r"failed on rank 0 of world size 3 \(ranks \[1, 2\] failed as well\)"
    ) as info:
        make(3).fail_on("all")
    assert info.value.failed_ranks == (0, 1, 2)


def test_constructor_failure_is_worker_error_naming_init():
    class Broken(Worker):
        def __init__(self):
            if self.rank == 1:
                raise RuntimeError("no device")

    with pytest.raises(WorkerError, match=r"Broken.__init__ failed on rank 1 of world size 2: RuntimeError: no device"):
        LocalWorkerGroup(ClassWithInitArgs(Broken), world_size=2)


def test_non_blocking_returns_future_with_collected_value():
    wg = make(2)
    fut = wg.add_later(3)
    assert isinstance(fut, WorkerFuture)
    assert fut.done()
    assert fut.get() == [8, 108]
    assert fut.result() == [8, 108]  # cached, not re-run
    assert [w.value for w in wg.workers] == [8, 8]
    assert fut.exception() is None


def test_non_blocking_error_surfaces_only_on_get():
    fut = make(2).fail_later()  # does not raise here, as with Ray
    assert fut.done()
    assert isinstance(fut.exception(), WorkerError)
    with pytest.raises(WorkerError, match=r"Counter.fail_later failed on rank 0") as info:
        fut.get()
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(WorkerError):
        fut.result()


def test_future_argument_is_resolved_before_dispatch():
    wg = make(2)
    fut = wg.execute_rank_zero_async("add", 2)  # rank 0: 7
    assert wg.add(fut) == [14, 112]  # every rank adds 7: 7 + 7 and 5 + 7 + 100


def test_async_methods_run_on_a_persistent_loop():
    wg = make(2)
    try:
        assert wg.async_add(1) == [6, 6]
        assert wg.async_add(1) == [7, 7]
    finally:
        wg.shutdown()
    assert wg.async_add(1) == [8, 8]  # a new loop is started on demand
    wg.shutdown()


def test_async_methods_work_when_driver_runs_an_event_loop():
    wg = make(1)

    async def driver():
        return wg.async_add(2)

    try:
        assert asyncio.run(driver()) == [7]
    finally:
        wg.shutdown()


def test_arguments_shared_by_reference_unless_isolated():
    box = []
    assert make(2).mutate(box) == [1, 2]  # in-process: both ranks append to the driver's list
    assert box == [0, 1]
    box = []
    assert make(2, isolate_args=True).mutate(box) == [1, 1]  # Ray-like: each rank gets a copy
    assert box == []


def test_isolated_results_must_be_picklable():
    with pytest.raises(WorkerError, match=r"Counter.give_lambda failed on rank 0"):
        make(1, isolate_args=True).give_lambda()
    with pytest.raises(TypeError, match=r"arguments of Counter.add for rank 0 cannot be pickled"):
        make(1, isolate_args=True).add(lambda: 0)


def test_constructor_validation():
    with pytest.raises(TypeError, match=r"wrap the class: LocalWorkerGroup\(ClassWithInitArgs\(MyWorker"):
        LocalWorkerGroup(Counter)
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        LocalWorkerGroup(ClassWithInitArgs(Counter), world_size=0)
    with pytest.raises(TypeError, match="needs a class"):
        ClassWithInitArgs(Counter())


def test_method_name_colliding_with_group_attribute_is_rejected():
    class Bad(Worker):
        @register()
        def execute_all(self):
            return None

    with pytest.raises(
        ValueError, match=r"Bad.execute_all cannot be bound on LocalWorkerGroup.*Rename the worker method"
    ):
        LocalWorkerGroup(ClassWithInitArgs(Bad))


def test_non_worker_classes_can_be_grouped():
    class Plain:
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def ping(self):
            return "pong"

    assert LocalWorkerGroup(ClassWithInitArgs(Plain), world_size=2).ping() == ["pong", "pong"]


def test_call_async_returns_a_future_of_what_the_blocking_call_returns():
    group = make(2)
    future = group.call_async("add", 3)  # a blocking method, called without waiting
    assert isinstance(future, WorkerFuture)
    assert future.get() == [8, 108]  # start 5 + 3 on each rank, + 100 * rank
    assert group.add(1) == [9, 109]  # the call ran once: state moved on by 3, then by 1
    assert group.call_async("add_later", 1).get() == [10, 110]  # a non-blocking one: the same future
    with pytest.raises(AttributeError, match=r"no @register-ed method 'nope'.*'add'"):
        group.call_async("nope")
