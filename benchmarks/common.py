"""Shared pieces of the benchmark scripts: machine peaks, how busy the box was, result files.

Every benchmark measures both sides of a comparison in the same run and reports, next to each figure, the
CPU share that *other* processes took while it ran (:class:`CpuWatch`): a figure measured while something
else used the cores is not comparable, and the column says so instead of hiding it.

Machine peaks are measured on the box, never taken from a datasheet:

* read bandwidth: best of repeated ``x.sum()`` over a 512 MiB float32 tensor (a decode step only reads its
  weights), with the ``dst.copy_(src)`` bandwidth (read + write) beside it;
* matmul peak: best of repeated ``torch.mm`` of 2048 x 2048 float32 (``2 n^3`` FLOPs), and optionally
  bfloat16 (slow on CPUs without AVX-512 BF16 or AMX: about a minute per multiply there).

Other processes can only lower a peak measurement, so callers keep the best of several (start and end).
On a shared virtual machine the host's load changes what the hardware gives from one minute to the next
(seen here: fp32 matmul 153 -> 65 GFLOP/s and bandwidth 25 -> 11 GB/s within a minute, nothing running in
the guest), so utilisation figures divide by a peak measured right next to each timed pass
(:func:`quick_peaks`), and comparisons alternate sides so that both see the same drift.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"


def load_avg() -> list[float]:
    """The 1-, 5- and 15-minute load averages (``os.getloadavg``), rounded."""
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------- CPU share
def _proc_stat() -> tuple[float, float, float]:
    """``(busy, steal, idle)`` CPU seconds of the whole machine since boot, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick, (idle + iowait) / tick


def _own_cpu() -> float:
    """CPU seconds of this process plus its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuWatch:
    """Measures how much CPU other processes used while a block ran (a context manager).

    ``others`` is the share of the machine's CPU capacity (``cores x wall seconds``) that processes other
    than this one and its finished children used; ``steal`` the share a hypervisor gave to other guests;
    ``own`` this process tree's share. Children must have exited (been waited for) before the block ends
    to be counted as own time. Linux only (``/proc/stat``); elsewhere every share is NaN.
    """

    def __init__(self) -> None:
        self.others = self.steal = self.own = math.nan
        self.seconds = 0.0

    def __enter__(self) -> CpuWatch:
        self._t0 = time.perf_counter()
        self._own0 = _own_cpu()
        try:
            self._stat0 = _proc_stat()
        except OSError:
            self._stat0 = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self._t0
        if self._stat0 is None:
            return
        busy1, steal1, _ = _proc_stat()
        capacity = max(self.seconds, 1e-9) * (os.cpu_count() or 1)
        own = _own_cpu() - self._own0
        self.own = own / capacity
        self.others = max(0.0, (busy1 - self._stat0[0]) - own) / capacity
        self.steal = (steal1 - self._stat0[1]) / capacity

    def as_dict(self) -> dict[str, float]:
        return {"seconds": self.seconds, "others_cpu": self.others, "steal_cpu": self.steal, "own_cpu": self.own}


def fmt_share(x: float) -> str:
    """A CPU share as a percentage (``'1.2%'``), ``'n/a'`` for NaN."""
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


# ---------------------------------------------------------------------------------------------- roofline
def _sync(device: str) -> None:
    import torch

    if device != "cpu":
        torch.get_device_module(device).synchronize()


def measure_bandwidth(mib: int = 512, reps: int = 8, device: str = "cpu") -> tuple[float, float]:
    """Best read bandwidth (``x.sum()``) and copy bandwidth (``dst.copy_(src)``, read + write), bytes/s.

    ``device``: ``cpu`` or an accelerator type (``cuda``); accelerator timings synchronize the device.
    """
    import torch

    n = mib * 2**20 // 4
    src, dst = torch.rand(n, device=device), torch.empty(n, device=device)
    dst.copy_(src)
    read = copy = 0.0
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        src.sum()
        _sync(device)
        read = max(read, n * 4 / (time.perf_counter() - start))
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        copy = max(copy, 2 * n * 4 / (time.perf_counter() - start))
    return read, copy


def measure_matmul(dtype: Any = None, n: int = 2048, reps: int = 5, device: str = "cpu") -> float:
    """Best ``torch.mm`` throughput in FLOP/s for ``n x n`` matrices of ``dtype`` (``2 n^3`` FLOPs each)."""
    import torch

    dtype = dtype or torch.float32
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    best = 0.0
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def measure_machine(previous: dict | None = None, *, bf16: bool = False, device: str = "cpu") -> dict:
    """Bandwidth and matmul peaks (GB/s, GFLOP/s) of ``device``, each the best of this measurement and
    ``previous``; an accelerator is measured with 2 GiB and 8192-wide matrices (its caches are large)."""
    import torch

    mib, n = (512, 2048) if device == "cpu" else (2048, 8192)
    read_bw, copy_bw = measure_bandwidth(mib, device=device)
    now = {
        "bandwidth_GBps": read_bw / 1e9,
        "copy_bandwidth_GBps": copy_bw / 1e9,
        "fp32_GFLOPs": measure_matmul(torch.float32, n, device=device) / 1e9,
        "bf16_GFLOPs": measure_matmul(torch.bfloat16, n, device=device) / 1e9 if bf16 else math.nan,
    }
    if previous:
        now = {k: v if math.isnan(v) else max(v, float(previous.get(k) or 0.0)) for k, v in now.items()}
    return now


def quick_peaks(device: str = "cpu") -> dict[str, float]:
    """A fast (~0.5 s) re-measurement of the fp32 matmul peak (GFLOP/s) and read bandwidth (GB/s).

    Shared (virtual) machines change speed by 2x within a minute, with nothing else running inside the
    guest: a figure is only comparable with a peak measured next to it. Benchmarks call this right before
    and after each timed pass and divide by the mean.
    """
    mib, n = (256, 1536) if device == "cpu" else (1024, 8192)
    read, _ = measure_bandwidth(mib=mib, reps=3, device=device)
    return {"fp32_GFLOPs": measure_matmul(n=n, reps=3, device=device) / 1e9, "bandwidth_GBps": read / 1e9}


def mean_peaks(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Key-wise mean of two :func:`quick_peaks` results."""
    return {k: (before[k] + after[k]) / 2 for k in before}


def machine_info() -> dict[str, Any]:
    """CPU model, core count, torch threads and Python version of this box."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = " ".join(sorted({f for f in text.split() if f.startswith(("avx512", "amx")) or f == "avx2"}))
    except OSError:
        pass
    return {
        "cpu": cpu,
        "isa": flags,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------------------------------------- results
def median_spread(values: list[float]) -> tuple[float, float, float]:
    """``(median, min, max)`` of ``values`` (NaN for an empty list)."""
    import statistics

    if not values:
        return math.nan, math.nan, math.nan
    return statistics.median(values), min(values), max(values)


def write_results(result: dict, markdown: str, json_path: Path | None, md_path: Path | None) -> None:
    """Print ``markdown`` and write the JSON and markdown files that were asked for."""
    print(markdown)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    if md_path:
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(markdown + "\n")
