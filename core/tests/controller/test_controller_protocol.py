"""The WorkerGroup protocol with a second backend: asynchronous handles, as the Ray group will have.

``ThreadWorkerGroup`` implements only the backend primitives (``world_size``, ``_submit``, ``_wait``,
``_done``) with one single-thread executor per worker, like one Ray actor each. Everything else
(binding, dispatch, collect, padding, futures) comes from the base class, so its results must equal
LocalWorkerGroup's.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

import numpy as np
import pytest
import torch

from verl.controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    Worker,
    WorkerError,
    WorkerFuture,
    WorkerGroup,
    WorkerMeta,
    register,
    registered_methods,
)
from verl.controller.worker import assigned_identity
from verl.protocol import DataProto


class ThreadWorkerGroup(WorkerGroup):
    def __init__(self, cls_with_init: ClassWithInitArgs, world_size: int) -> None:
        super().__init__()
        self.worker_cls = cls_with_init.cls
        self._pools = [ThreadPoolExecutor(max_workers=1) for _ in range(world_size)]
        self._workers = []
        for rank in range(world_size):
            with assigned_identity(WorkerMeta(rank=rank, world_size=world_size)):
                self._workers.append(cls_with_init())
        self._bind_worker_methods(registered_methods(self.worker_cls))

    @property
    def world_size(self) -> int:
        return len(self._workers)

    def _submit(self, rank, method_name, args, kwargs):
        fn = getattr(self._workers[rank], method_name)
        return rank, method_name, self._pools[rank].submit(fn, *args, **kwargs)

    def _wait(self, handles, timeout=None):
        results, failed = [], []
        for rank, method_name, fut in handles:
            try:
                results.append(fut.result(timeout))
            except FuturesTimeout:
                raise TimeoutError(f"rank {rank} still running {method_name}") from None
            except Exception as exc:
                failed.append((rank, method_name, exc))
        if failed:
            rank, name, exc = failed[0]
            raise WorkerError(
                self.worker_class_name,
                rank,
                name,
                exc,
                world_size=self.world_size,
                failed_ranks=tuple(r for r, _, _ in failed),
            ) from exc
        return results

    def _done(self, handles):
        return all(fut.done() for _, _, fut in handles)

    def close(self):
        for pool in self._pools:
            pool.shutdown(wait=True)


class Gated(Worker):
    def __init__(self):
        self.gate = threading.Event()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data: DataProto, factor: float = 2.0) -> DataProto:
        return DataProto.from_dict(
            tensors={"y": data.batch["x"] * factor}, non_tensors={"rank": np.full(len(data), self.rank)}
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def wait_for_gate(self):
        self.gate.wait(timeout=5)
        return self.rank * 10

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def rows(self, data: DataProto):
        if self.rank == 1 and len(data) > 100:
            raise MemoryError("too many rows")
        return len(data)


@pytest.fixture
def thread_group():
    wg = ThreadWorkerGroup(ClassWithInitArgs(Gated), world_size=3)
    yield wg
    for w in wg._workers:
        w.gate.set()
    wg.close()


def batch(n):
    return DataProto.from_dict(tensors={"x": torch.arange(n, dtype=torch.float32)})


def test_same_results_as_local_group(thread_group):
    local = LocalWorkerGroup(ClassWithInitArgs(Gated), world_size=3)
    for n in (1, 4, 7):
        a, b = thread_group.scale(batch(n), factor=3.0), local.scale(batch(n), factor=3.0)
        assert a.batch["y"].tolist() == b.batch["y"].tolist() == [3.0 * i for i in range(n)]
        assert list(a.non_tensor_batch["rank"]) == list(b.non_tensor_batch["rank"])
        assert thread_group.rows(batch(n)) == local.rows(batch(n)) == [-(-n // 3)] * 3


def test_non_blocking_future_is_pending_until_workers_finish(thread_group):
    fut = thread_group.wait_for_gate()
    assert isinstance(fut, WorkerFuture) and not fut.done()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.01)
    for w in thread_group._workers:
        w.gate.set()
    assert fut.get(timeout=5) == [0, 10, 20]  # a timeout is not final: waiting again succeeds
    assert fut.done()


def test_errors_from_async_backend_are_worker_errors(thread_group):
    with pytest.raises(WorkerError, match=r"Gated.rows failed on rank 1 of world size 3: MemoryError") as info:
        thread_group.rows(batch(303))
    assert isinstance(info.value.__cause__, MemoryError)


def test_worker_side_materialization_of_a_future_argument():
    class Adder(Worker):
        @register()
        def add(self, x, y=0):
            return x + y + self.rank

    wg = LocalWorkerGroup(ClassWithInitArgs(Adder), world_size=2)
    fut = wg.execute_rank_zero_async("add", 5)
    # execute_all hands the future itself to each worker; @register resolves it there (5 + 1 + rank).
    assert wg.execute_all("add", fut, y=1) == [6, 7]


def test_importing_the_controller_does_not_import_torch():
    code = "import sys, verl.controller; print('torch' in sys.modules, 'verl.protocol' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
