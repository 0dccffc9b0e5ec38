"""Reward code isolation: custom scorers in worker processes with timeouts, a memory limit and crash recovery.

One scorer file reacts to the decoded response (the "mode"): it raises, returns NaN/inf/None/wrong types, hangs,
exits, segfaults or allocates beyond the memory limit. Expected scores are hand-computed: an ``ok``-style response
scores ``len(response) / 10``; every failure scores 0.0 under ``on_error="zero"``.
"""

from __future__ import annotations

import logging
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rewards import RewardFunctionError, RewardFunctionLoadError, RewardManager
from verl.rewards.manager import ScorerSpec

pytestmark = pytest.mark.multiprocess

SCORER = '''
import asyncio
import ctypes
import os
import time
from pathlib import Path

# Appended at import time: proves the module is imported once per worker process, not per sample.
with open(Path(__file__).with_suffix(".imports"), "a") as fh:
    fh.write(f"{os.getpid()}\\n")


class PrivateError(Exception):
    """Defined only here: the trainer cannot unpickle it."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    mode = solution_str
    if mode.startswith("ok"):
        return len(mode) / 10
    if mode == "raise":
        raise ValueError(f"cannot parse {ground_truth!r}")
    if mode == "nan":
        return float("nan")
    if mode == "inf":
        return float("inf")
    if mode == "none":
        return None
    if mode == "str":
        return "1.0"
    if mode == "list":
        return [1.0]
    if mode == "nodict":
        return {"acc": 1.0}
    if mode == "dict":
        return {"score": 0.5, "pid": os.getpid()}
    if mode == "hang":
        Path(__file__).with_suffix(".hang").write_text(str(os.getpid()))
        time.sleep(120)
    if mode == "spawn":
        import subprocess

        child = subprocess.Popen(["sleep", "120"])
        Path(__file__).with_suffix(".child").write_text(str(child.pid))
        time.sleep(120)
    if mode == "exit":
        os._exit(7)
    if mode == "segv":
        ctypes.string_at(0)
    if mode == "hog":
        block = bytearray(400 * 1024 * 1024)  # over the 200 MiB limit of these tests
        return float(len(block) > 0)
    if mode == "private":
        raise PrivateError("only the worker knows this class")
    raise AssertionError(f"unknown mode {mode!r}")


async def compute_async(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    return len(solution_str) / 10
'''

MEMORY_MB = 200
PAD = 0


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == PAD))


def make_batch(texts: list[str], source: str = "my/source") -> DataProto:
    bs, width = len(texts), max(len(t) for t in texts)
    responses = torch.full((bs, width), PAD, dtype=torch.long)
    mask = torch.zeros((bs, width), dtype=torch.long)
    for i, text in enumerate(texts):
        responses[i, : len(text)] = torch.tensor([ord(c) for c in text])
        mask[i, : len(text)] = 1
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={
            "data_source": np.array([source] * bs, dtype=object),
            "reward_model": np.array([{"ground_truth": f"gt{i}"} for i in range(bs)], dtype=object),
        },
    )


@pytest.fixture(scope="module")
def scorer_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("scorer") / "scorer.py"
    path.write_text(textwrap.dedent(SCORER))
    return path


def manager(path: Path, **kwargs) -> RewardManager:
    options = {"timeout_s": 1.0, "num_workers": 2, "memory_limit_mb": MEMORY_MB, **kwargs}
    return RewardManager(CharTokenizer(), compute_score=ScorerSpec(str(path)), **options)


@pytest.fixture(scope="module")
def zero_manager(scorer_path):
    m = manager(scorer_path, on_error="zero")
    yield m
    m.close()


ALL_MODES = ["ok", "raise", "nan", "inf", "none", "str", "list", "nodict", "hang"]
ALL_MODES += ["exit", "segv", "hog", "private", "dict", "okay"]
# Hand-computed: ok -> 0.2, okay -> 0.4, dict -> 0.5, everything else fails and scores 0.0.
EXPECTED_SCORES = [0.2] + [0.0] * 12 + [0.5, 0.4]
EXPECTED_METRICS = {
    "reward/errors": 12,
    "reward/timeouts": 1,  # hang
    "reward/invalid": 6,  # nan, inf, none, str, list, nodict
    "reward/crashes": 2,  # exit, segv
    "reward/empty_responses": 0,
}


def test_every_bad_result_is_zeroed_counted_and_the_pool_survives(zero_manager, scorer_path, caplog):
    data = make_batch(ALL_MODES)
    for call in range(2):  # the second call proves the replaced workers score like the first ones
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="verl.rewards.manager"):
            caplog.clear()
            out = zero_manager(data, return_dict=True)
        elapsed = time.monotonic() - start
        scores = out["reward_tensor"].sum(-1).tolist()
        assert scores == pytest.approx(EXPECTED_SCORES), call
        assert out["metrics"] == EXPECTED_METRICS
        assert elapsed < 6.0, f"one 1 s timeout and three worker restarts took {elapsed:.1f}s"
        # One warning per kind per call, naming the first failing sample of that kind and its error.
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 4
        by_kind = {
            kind: w for w in warnings for kind in ("exception", "invalid_result", "timeout", "crash") if kind in w
        }
        assert "reward sample 1 " in by_kind["exception"] and "ValueError: cannot parse 'gt1'" in by_kind["exception"]
        assert "reward sample 2 " in by_kind["invalid_result"] and "nan" in by_kind["invalid_result"]
        assert "reward sample 8 " in by_kind["timeout"] and "1.0s" in by_kind["timeout"]
        assert "reward sample 9 " in by_kind["crash"] and "exit code 7" in by_kind["crash"]
    # hang, exit, segv and hog (MemoryError retires the worker) each replace a worker, on each of the two calls.
    assert zero_manager.worker_restarts == 8
    # dict result with extra keys: reward_extra_info keeps them; the scorer ran in another process.
    pid = out["reward_extra_info"]["pid"][13]
    assert isinstance(pid, int) and pid != os.getpid()
    assert out["reward_extra_info"]["score"][13] == 0.5
    # The hung worker was killed, not abandoned.
    hung = int(scorer_path.with_suffix(".hang").read_text())
    assert not _running(hung)


def test_timeout_kills_the_scorers_own_children(zero_manager, scorer_path):
    out = zero_manager(make_batch(["spawn", "ok"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.0, 0.2])
    assert out["metrics"]["reward/timeouts"] == 1
    child = int(scorer_path.with_suffix(".child").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # SIGKILLed with the worker's process group
        if not _running(child):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the scorer's child process {child} outlived its killed worker")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by whatever init the machine or container has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_scorer_module_imported_once_per_worker(tmp_path):
    path = tmp_path / "once.py"
    path.write_text(textwrap.dedent(SCORER))
    m = manager(path, num_workers=2)
    try:
        for _ in range(3):
            out = m(make_batch(["ok"] * 40 + ["okay"] * 40), return_dict=True)
            assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.2] * 40 + [0.4] * 40)
    finally:
        m.close()
    pids = path.with_suffix(".imports").read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2 and str(os.getpid()) not in pids


def test_crash_and_exception_details(zero_manager):
    out = zero_manager(make_batch(["segv", "private", "ok"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.0, 0.0, 0.2])
    assert out["metrics"]["reward/crashes"] == 1 and out["metrics"]["reward/errors"] == 2


def test_all_failed_in_worker_processes_names_the_file_and_keeps_the_traceback(zero_manager, scorer_path):
    from verl.rewards import AllRewardsFailedError

    with pytest.raises(AllRewardsFailedError) as info:
        zero_manager(make_batch(["private", "raise", "nan"]))
    err = info.value
    assert (err.samples, err.index, err.kind) == (3, 0, "exception")
    assert f"'compute_score' in {scorer_path}" in str(err)
    assert "PrivateError: only the worker knows this class" in str(err)
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "Traceback" in notes and "only the worker knows this class" in notes
    # The pool is fine afterwards.
    assert zero_manager(make_batch(["ok"]), return_dict=True)["reward_tensor"].sum().item() == pytest.approx(0.2)


@pytest.fixture(scope="module")
def fail_manager(scorer_path):
    m = manager(scorer_path, on_error="fail", num_workers=1)
    yield m
    m.close()


@pytest.mark.parametrize(
    ("mode", "kind", "detail"),
    [
        ("raise", "exception", "ValueError: cannot parse 'gt1'"),
        ("private", "exception", "PrivateError: only the worker knows this class"),
        ("nan", "invalid_result", "result is nan"),
        ("none", "invalid_result", "result is None"),
        ("str", "invalid_result", "has type str"),
        ("nodict", "invalid_result", "without a 'score' key"),
        ("hang", "timeout", "no result after 1.0s"),
        ("exit", "crash", "exit code 7"),
        ("segv", "crash", "SIGSEGV"),
        ("hog", "exception", "MemoryError"),
    ],
)
def test_fail_policy_names_sample_source_and_error(fail_manager, mode, kind, detail):
    with pytest.raises(RewardFunctionError) as info:
        fail_manager(make_batch(["ok", mode, "okay"]), return_dict=True)
    err = info.value
    assert (err.index, err.data_source, err.kind) == (1, "my/source", kind)
    message = str(err)
    assert "sample 1" in message and "'my/source'" in message and detail in message, message
    # The pool survives the failure: later samples still score.
    out = fail_manager(make_batch(["ok", "okay"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.2, 0.4])


def test_fail_policy_keeps_the_worker_traceback(fail_manager):
    with pytest.raises(RewardFunctionError) as info:
        fail_manager(make_batch(["raise"]))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Traceback" in notes and "cannot parse" in notes


def test_memory_limit_none_allows_the_allocation(scorer_path):
    m = manager(scorer_path, num_workers=1, memory_limit_mb=None, timeout_s=60.0)  # 400 MiB zero-fill: no rush
    try:
        out = m(make_batch(["hog"]), return_dict=True)
    finally:
        m.close()
    assert out["reward_tensor"].sum(-1).tolist() == [1.0] and out["metrics"]["reward/errors"] == 0


def test_async_scorer_in_a_worker(scorer_path):
    spec = ScorerSpec(str(scorer_path), name="compute_async")
    m = RewardManager(CharTokenizer(), compute_score=spec, num_workers=1)
    try:
        assert m.isolation == "process"
        assert m(make_batch(["ok", "okay"])).sum(-1).tolist() == pytest.approx([0.2, 0.4])
    finally:
        m.close()


def test_thread_isolation_with_the_same_spec(scorer_path):
    """isolation=thread loads the file in this process; non-crashing failures behave the same."""
    m = manager(scorer_path, isolation="thread", on_error="zero")
    out = m(make_batch(["ok", "raise", "nan", "none", "str", "nodict", "hang", "dict"]), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([0.2, 0, 0, 0, 0, 0, 0, 0.5])
    assert out["metrics"]["reward/errors"] == 6 and out["metrics"]["reward/invalid"] == 4
    assert out["metrics"]["reward/timeouts"] == 1 and out["reward_extra_info"]["pid"][7] == os.getpid()


def test_isolation_choice_and_validation(scorer_path):
    assert RewardManager(CharTokenizer()).isolation == "thread"  # built-in scorers: trusted, in-process
    assert RewardManager(CharTokenizer(), compute_score=lambda **kw: 1.0).isolation == "thread"
    assert RewardManager(CharTokenizer(), isolation="none").isolation == "none"
    with pytest.raises(ValueError, match="cannot use a Python callable"):
        RewardManager(CharTokenizer(), compute_score=lambda **kw: 1.0, isolation="process")
    with pytest.raises(ValueError, match="isolation='sandbox'"):
        RewardManager(CharTokenizer(), isolation="sandbox")
    with pytest.raises(ValueError, match="memory_limit_mb=0"):
        manager(scorer_path, memory_limit_mb=0)


def test_builtin_scorers_in_worker_processes():
    m = RewardManager(CharTokenizer(), isolation="process", num_workers=1)
    try:
        out = m(make_batch(["#### 72", "#### 7"], source="openai/gsm8k"), return_dict=True)
    finally:
        m.close()
    # GSM8K strict: "#### 72" against "gt0"/"gt1" never matches -> 0.0 (format_score 0.0).
    assert out["reward_tensor"].sum(-1).tolist() == [0.0, 0.0] and out["metrics"]["reward/errors"] == 0


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("x = 1\n", "custom_reward_function.name='compute_score' not found"),
        ("import os\nos._exit(3)\n", "died while importing"),
    ],
)
def test_load_errors_surface_at_construction(tmp_path, source, match):
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(RewardFunctionLoadError, match=match):
        manager(path, num_workers=1)


def test_closed_manager_refuses_to_score(scorer_path):
    m = manager(scorer_path, num_workers=1)
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        m(make_batch(["ok"]))


def test_overhead_per_sample_is_small(scorer_path):
    """1000 tiny samples: chunked dispatch keeps the process pool within milliseconds of in-process scoring."""
    data = make_batch(["ok", "okay"] * 500)
    m = manager(scorer_path, num_workers=2)
    try:
        m(data)  # warm
        start = time.perf_counter()
        scores = m(data).sum(-1)
        elapsed = time.perf_counter() - start
    finally:
        m.close()
    assert scores.tolist() == pytest.approx([0.2, 0.4] * 500)
    # Measured ~15 ms (15 us/sample) on 2 shared cores; the bound leaves a wide margin for a loaded machine.
    assert elapsed < 1.5, f"{elapsed * 1e3:.0f} ms for 1000 samples"
