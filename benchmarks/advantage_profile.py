"""Where the GRPO advantage's time goes: ours vs verl 0.9.1's vectorized estimator, per kernel and per heap state.

    python benchmarks/advantage_profile.py --reps 3 --threads 2 \\
        --json benchmarks/results/advantage_profile.json --md benchmarks/results/advantage_profile.md

``protocol.py`` times our ``grpo`` against verl's ``grpo_vectorized`` once, in whatever state its process left
glibc's heap. Both estimators allocate (batch, response_len) float32 outputs, and on a CPU a fresh 4 MB block
costs about as much as the arithmetic when its pages come new from the kernel (a page fault per 4 KiB). So this
script runs both sides in three controlled heap states, each in its own subprocess (ours with this interpreter,
verl with the venv of ``protocol.py``), the order of the sides flipped on every other rep:

* ``mmap``: ``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` fixed: every block of 128 KiB or more is a fresh mapping,
  unmapped on free (glibc's behaviour in a process that has not yet freed a large block);
* ``glibc``: glibc's defaults with ``protocol.py``'s whole batch built and kept (about 90 MB at the default sizes;
  building it frees large temporaries, which raises glibc's dynamic mmap threshold). Close to ``protocol.py``'s
  process but not the same: that one has also run the DataProto ops and, on verl's side, verl's slow ``grpo``
  before, and it times with the garbage collector paused (this script leaves it on, as a trainer does);
* ``caching``: ``mallopt(M_TRIM_THRESHOLD, -1)`` + ``mallopt(M_MMAP_MAX, 0)``, what a verl-core ``cpu`` worker
  sets up (``verl.platform.host_allocator``): freed memory stays in the heap.

Inputs are ``protocol.py``'s (``make_inputs``: 1024 x 1024 response tokens, int64 mask, one 0/1 reward per row,
128 uid groups of 8), built in every state. Per (side, state) the table gives the best and the median call (ms),
the minor page faults per call (``getrusage``), the self CPU time of all torch ops per call under ``torch.profiler``
(100 calls after the timed ones) and the ops that took most of it. Work outside torch's ops (Python, numpy: verl
factorises the uid strings with ``np.unique``) is in the timed figures but not in the profiled ones. Both sides'
advantages are compared on the mask (``--atol``) before timing.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, load_avg, machine_info, median_spread, write_results
from protocol import DEFAULT_VENV, SIDES, VERL_VERSION, ensure_verl_venv, make_inputs, outcome_kwargs

STATES = ("mmap", "glibc", "caching")
ESTIMATOR = {"ours": "grpo", "verl": "grpo_vectorized"}
# mallopt(3) parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
TOP_KERNELS = 6


def set_heap_state(state: str) -> None:
    """Put glibc's heap of this process into ``state`` (see the module docstring). Raises OSError if refused.

    ``caching`` repeats the two calls of ``verl.platform.host_allocator`` here because verl's side runs in a venv
    without verl-core: both sides must get the same settings from the same code.
    """
    if state == "glibc":
        return
    libc = ctypes.CDLL(None)
    calls = [(M_MMAP_THRESHOLD, 128 << 10)] if state == "mmap" else [(M_TRIM_THRESHOLD, -1), (M_MMAP_MAX, 0)]
    for param, value in calls:
        if libc.mallopt(param, value) != 1:
            raise OSError(f"mallopt({param}, {value}) refused: not glibc, or an allocator was preloaded")


def worker(args: argparse.Namespace) -> int:
    """One (side, state): times and profiles the estimator, writes JSON (and the masked advantages) to ``--out``."""
    set_heap_state(args.state)
    import numpy as np
    import torch
    from torch.profiler import profile

    # Each import exists in one package only (verl-core's ``verl.algorithms``, verl's ``verl.trainer``), so a worker
    # that got the other side's ``verl`` fails here.
    if args.worker == "ours":
        from verl.algorithms import get_adv_estimator_fn
    else:
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.rows, 2 * args.response_len, args.response_len, args.group, args.seed)
    a = inputs["adv"]
    fn = get_adv_estimator_fn(ESTIMATOR[args.worker])
    kwargs = outcome_kwargs(inputs)
    if args.state != "glibc":
        del inputs["tensors"]  # the batch belongs to the ``glibc`` state only
    adv, _ = fn(**kwargs)
    np.save(Path(args.out).with_suffix(".npy"), adv[a["response_mask"] != 0].double().numpy())
    del adv
    for _ in range(args.calls // 4):
        fn(**kwargs)
    samples = []
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(args.calls):
        start = time.perf_counter()
        fn(**kwargs)
        samples.append(time.perf_counter() - start)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / args.calls
    n_prof = 100
    with profile() as prof:
        for _ in range(n_prof):
            fn(**kwargs)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = sum(e.self_cpu_time_total for e in events) / n_prof
    kernels = [
        {"name": e.key, "us_per_call": e.self_cpu_time_total / n_prof, "calls_per_call": e.count / n_prof}
        for e in events[:TOP_KERNELS]
    ]
    samples.sort()
    result = {
        "best_s": samples[0],
        "median_s": samples[len(samples) // 2],
        "faults_per_call": faults,
        "profiled_us_per_call": total_us,
        "kernels": kernels,
    }
    Path(args.out).write_text(json.dumps(result))
    return 0


def run_worker(side: str, python: Path, state: str, args: argparse.Namespace, out: Path) -> dict:
    """One worker subprocess; raises RuntimeError with its stderr if it fails."""
    cmd = [str(python), str(Path(__file__).resolve()), "--worker", side, "--state", state, "--out", str(out)]
    for flag in ("rows", "response_len", "group", "seed", "threads", "calls"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    # Nothing inherited may set the heap up another way: a preloaded allocator, MALLOC_* or glibc's malloc tunables.
    dropped = ("PYTHONPATH", "LD_PRELOAD", "GLIBC_TUNABLES")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("MALLOC_")}
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent)  # common.py, protocol.py: never a verl package
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO))
    if proc.returncode != 0:
        raise RuntimeError(f"{side}/{state} worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def markdown(result: dict) -> str:
    """The results as printed and written to ``--md``: a header, one row per (state, side), ours / verl per state."""
    s, m = result["settings"], result["machine"]
    lines = [
        f"machine: {m['cpu']} ({m['cores']} cores), {s['threads']} torch threads; load average "
        f"{result['load_avg_start']} -> {result['load_avg_end']}",
        f"ours: grpo (verl-core) | verl: grpo_vectorized (verl {s['verl_version']}, PyPI); {s['rows']} x "
        f"{s['response_len']} response tokens, groups of {s['group']}; {s['reps']} reps, side order flipped every rep, "
        f"{s['calls']} timed calls each; median (min-max) over reps of each run's best call",
        f"check: max |ours - verl| on the mask {result['max_abs_diff']:.1e} (atol {s['atol']})",
        "",
        "| state | side | best ms | median call ms | faults / call | torch ops us / call | top ops, self CPU us per call (calls) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        kernels = ", ".join(
            f"{k['name'].removeprefix('aten::')} {k['us_per_call']:.0f} ({k['calls_per_call']:g})"
            for k in row["kernels"]
        )
        lines.append(
            f"| {row['state']} | {row['side']} | {row['best_ms'][0]:.3f} ({row['best_ms'][1]:.3f}-"
            f"{row['best_ms'][2]:.3f}) | {row['median_ms']:.3f} | {row['faults_per_call']:.0f} | "
            f"{row['profiled_us']:.0f} | {kernels} |"
        )
    lines.append("")
    for state in s["states"]:
        by_side = {r["side"]: r for r in result["rows"] if r["state"] == state}
        lines.append(f"- {state}: ours / verl = {by_side['ours']['best_ms'][0] / by_side['verl']['best_ms'][0]:.2f}")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    import numpy as np

    python = {"ours": Path(sys.executable), "verl": ensure_verl_venv(args.verl_venv.expanduser(), args.verl_version)}
    start_load = load_avg()
    runs: dict[tuple[str, str], list[dict]] = {(st, sd): [] for st in args.states for sd in SIDES}
    max_diff = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for state in args.states:
                advs = {}
                for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                    out = Path(tmp) / f"{side}-{state}-{rep}.json"
                    runs[(state, side)].append(run_worker(side, python[side], state, args, out))
                    advs[side] = np.load(out.with_suffix(".npy"))
                    print(
                        f"rep {rep + 1} {state:8s} {side:5s} best {runs[(state, side)][-1]['best_s'] * 1e3:.3f} ms",
                        file=sys.stderr,
                    )
                if advs["ours"].shape != advs["verl"].shape:
                    raise RuntimeError(f"advantage shapes differ: {advs['ours'].shape} vs {advs['verl'].shape}")
                max_diff = max(max_diff, float(np.max(np.abs(advs["ours"] - advs["verl"]))))
    if not max_diff <= args.atol:
        print(f"ERROR: advantages differ by {max_diff:.3g} > {args.atol} on the mask", file=sys.stderr)
    rows = []
    for (state, side), reps in runs.items():
        best = [r["best_s"] * 1e3 for r in reps]
        last = reps[-1]
        rows.append(
            {
                "state": state,
                "side": side,
                "best_ms": median_spread(best),
                "median_ms": median_spread([r["median_s"] * 1e3 for r in reps])[0],
                "faults_per_call": median_spread([r["faults_per_call"] for r in reps])[0],
                "profiled_us": median_spread([r["profiled_us_per_call"] for r in reps])[0],
                "kernels": last["kernels"],
            }
        )
    settings = {
        k: getattr(args, k) for k in ("reps", "threads", "rows", "response_len", "group", "calls", "atol", "states")
    }
    settings["verl_version"] = args.verl_version
    result = {
        "settings": settings,
        "machine": machine_info(),
        "load_avg_start": start_load,
        "load_avg_end": load_avg(),
        "max_abs_diff": max_diff,
        "rows": rows,
        "runs": {f"{st}/{sd}": v for (st, sd), v in runs.items()},
    }
    write_results(result, markdown(result), args.json, args.md)
    return 0 if max_diff <= args.atol else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per side and state (side order flipped every rep)")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per run")
    parser.add_argument("--threads", type=int, default=2, help="torch/OpenMP threads on both sides")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (rows sharing a uid)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--states", nargs="+", default=list(STATES), choices=STATES)
    parser.add_argument("--atol", type=float, default=1e-5, help="advantage tolerance across sides, on the mask")
    parser.add_argument("--verl-venv", type=Path, default=DEFAULT_VENV, help="venv with verl from PyPI")
    parser.add_argument("--verl-version", default=VERL_VERSION)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    parser.add_argument("--worker", choices=SIDES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state", choices=STATES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
