"""``verl.rewards.process_limits``: each limit read back with ``getrlimit`` in a fresh interpreter (limits are
per process, so the test process itself is never limited). Expected values are the requested MiB/seconds times
their unit, computed here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from verl.rewards import process_limits

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="resource limits are POSIX")
MB = 1024 * 1024


def _child(body: str) -> dict:
    code = textwrap.dedent(
        """
        import json, resource, sys
        sys.path.insert(0, {src!r})
        import process_limits as pl
        names = {{"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "fsize": resource.RLIMIT_FSIZE,
                 "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}}
        out = {{}}
        """
    ).format(src=str(process_limits.__file__).rsplit("/", 1)[0])
    code += textwrap.dedent(body)
    code += "\nout.update({k: list(resource.getrlimit(v)) for k, v in names.items()})\nprint(json.dumps(out))\n"
    # Loaded by path in a bare interpreter, as the code interpreter's child does: proves it is stdlib-only.
    run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_apply_limits_sets_soft_and_hard_to_each_value():
    out = _child(
        """
        applied, skipped = pl.apply_limits(memory_mb=300, cpu_s=7, file_size_mb=2, open_files=40)
        out["applied"], out["skipped"] = applied, skipped
        """
    )
    assert out["applied"] == ["rlimit_core", "rlimit_as", "rlimit_cpu", "rlimit_fsize", "rlimit_nofile"]
    assert out["skipped"] == {}
    assert out["as"] == [300 * MB, 300 * MB]
    assert out["cpu"] == [7, 8]  # SIGXCPU at the soft limit, SIGKILL one second later
    assert out["fsize"] == [2 * MB, 2 * MB]
    assert out["nofile"] == [40, 40]
    assert out["core"][0] == 0


def test_none_leaves_a_limit_alone_and_a_lower_hard_limit_wins():
    out = _child(
        """
        resource.setrlimit(resource.RLIMIT_NOFILE, (30, 30))
        before_cpu = resource.getrlimit(resource.RLIMIT_CPU)
        applied, _ = pl.apply_limits(open_files=100)
        out["applied"], out["before_cpu"] = applied, list(before_cpu)
        """
    )
    assert out["applied"] == ["rlimit_core", "rlimit_nofile"]
    assert out["nofile"] == [30, 30]  # cannot raise above the existing hard limit: capped, not an error
    assert out["cpu"] == out["before_cpu"]


def test_limit_memory_keeps_the_hard_limit_and_python_gets_memory_error():
    out = _child(
        """
        hard_before = resource.getrlimit(resource.RLIMIT_AS)[1]
        pl.limit_memory(200)
        try:
            bytearray(400 * 1024 * 1024)
            out["allocated"] = True
        except MemoryError:
            out["allocated"] = False
        out["hard_before"] = hard_before
        """
    )
    assert out["as"] == [200 * MB, out["hard_before"]]
    assert out["allocated"] is False
    assert out["core"][0] == 0
