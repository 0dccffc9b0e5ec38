"""The cpu platform's host allocator policy (``VERL_CPU_ALLOCATOR``): the kernel's own counters (minor page faults
from ``getrusage``, ``VmRSS``) show whether freed tensor memory is reused, kept and given back.

The process-wide settings run in a fresh interpreter per case, so this test process keeps glibc's defaults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from verl.platform import host_allocator
from verl.platform.host_allocator import ALLOCATOR_ENV, requested_mode

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or host_allocator._libc() is None, reason="needs glibc's mallopt (Linux)"
)

# Eight rounds of a micro-batch's pattern (a 256 MiB and a 64 MiB tensor allocated, touched, freed); prints the
# minor faults of each round and the RSS after the frees, before and after Platform.empty_cache(). The Python
# objects made between rounds land in the freed heap too, so the caching heap needs a few rounds to reach the size
# where both blocks fit again (measured: faults of 81956, 16384, 16384, then 0 per round).
_PROBE = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    from verl.platform.cpu import CpuPlatform

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

    cpu = CpuPlatform()
    mode = cpu.configure_allocator()
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rounds = []
    for _ in range(8):
        before = faults()
        block = torch.empty(64 << 20, dtype=torch.float32)
        block.fill_(1.0)
        small = torch.empty(16 << 20, dtype=torch.float32)
        small.fill_(2.0)
        del block, small
        rounds.append(faults() - before)
    kept = rss()
    cpu.empty_cache()
    print(json.dumps({"mode": mode, "rounds": rounds, "kept": kept, "released": rss()}))
    """
)

PAGES = (320 << 20) // 4096


def _probe(policy: str | None) -> dict:
    # The probe must see glibc's defaults but for the policy: no preloaded allocator, no MALLOC_* / tunables.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (ALLOCATOR_ENV, "LD_PRELOAD", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")
    }
    if policy is not None:
        env[ALLOCATOR_ENV] = policy
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_caching_reuses_freed_pages_and_empty_cache_returns_them():
    res = _probe(None)  # unset: the default policy
    assert res["mode"] == "caching"
    first = res["rounds"][0]
    # First touch of 320 MiB maps it (one fault per 4 KiB page; fewer with transparent huge pages).
    assert first >= PAGES // 512, res
    # The last two rounds: the heap has its working size by then (it took three rounds when measured).
    assert sum(res["rounds"][-2:]) <= max(first // 20, 64), f"freed pages were not reused: {res}"
    assert res["kept"] - res["released"] >= 200 << 20, f"empty_cache gave back too little: {res}"


@glibc
def test_system_policy_keeps_glibcs_defaults():
    # The control of the test above: glibc unmaps both blocks on free, so every round faults again.
    res = _probe("system")
    assert res["mode"] == "system"
    first = res["rounds"][0]
    assert first >= PAGES // 512 and min(res["rounds"][1:]) >= first // 2, res


def test_requested_mode_reads_the_environment():
    assert requested_mode({}) == "caching"
    assert requested_mode({ALLOCATOR_ENV: ""}) == "caching"
    assert requested_mode({ALLOCATOR_ENV: " System "}) == "system"
    with pytest.raises(ValueError, match=r"VERL_CPU_ALLOCATOR='jemalloc'.*'caching'.*'system'"):
        requested_mode({ALLOCATOR_ENV: "jemalloc"})


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({ALLOCATOR_ENV: "system"}, "system"),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "preloaded (jemalloc)"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "preloaded (tcmalloc)"),
    ],
)
def test_settings_that_change_nothing(monkeypatch, environ, expected):
    # None of these calls mallopt, so they can run in this process.
    monkeypatch.setattr(host_allocator, "_applied", None)
    assert host_allocator.configure_host_allocator(environ) == expected
    assert host_allocator._applied == expected
    # The first call decides for the process: a later one with another environment reports the same.
    assert host_allocator.configure_host_allocator({ALLOCATOR_ENV: "caching"}) == expected


def test_not_glibc_changes_nothing(monkeypatch):
    monkeypatch.setattr(host_allocator, "_applied", None)
    monkeypatch.setattr(host_allocator, "_libc", lambda: None)
    assert host_allocator.configure_host_allocator({}) == "system (not glibc)"
    assert host_allocator.release_host_cache() is False


def test_bad_policy_fails_the_worker_setup(monkeypatch):
    from verl.platform.cpu import CpuPlatform

    monkeypatch.setenv(ALLOCATOR_ENV, "fast")
    with pytest.raises(ValueError, match="VERL_CPU_ALLOCATOR"):
        CpuPlatform().configure_allocator()
