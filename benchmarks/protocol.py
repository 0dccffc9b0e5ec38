"""DataProto ops and advantage estimators: ours (verl-core) vs the ``verl`` PyPI package, on the same batch.

    /work/venv-vllm/bin/python benchmarks/protocol.py --reps 3 \\
        --json benchmarks/protocol_results.json --md benchmarks/protocol_results.md

Both packages are imported as ``verl``, so they never share a process: every measurement is one
subprocess, ours with the interpreter that runs this script (verl-core installed), theirs with the python
of a separate venv (``--verl-venv``, default ``~/.cache/verl/bench/venv-verl-pypi``; created on first
use, see below). Each subprocess builds the same inputs from ``--seed`` (torch and numpy generators,
same versions on both sides), so both sides see identical data.

Workload (defaults; ``--rows``, ``--seq-len``, ``--response-len`` shrink it for a quick try), shaped as
one PPO/GRPO step of a real RL batch:

* batch: 1024 rows, 2048 tokens (1024 left-padded prompt + 1024 right-padded response, random lengths);
  ``input_ids``, ``attention_mask``, ``position_ids`` int64 (1024, 2048); ``prompts``, ``responses``,
  ``response_mask`` int64 (1024, 1024); ``old_log_probs``, ``ref_log_prob`` float32 (1024, 1024), about
  90 MB in all; non-tensor columns ``uid`` (uuid strings, 128 prompts x 8 responses, numpy object) and
  ``data_source`` (object strings); a small ``meta_info``.
* ``chunk``: ``batch.chunk(8)`` (dispatch to 8 workers: views, 8 x 128 rows);
* ``split``: ``batch.split(128)`` (PPO mini-batches: 8 x 128 rows, verl slices row by row range);
* ``concat``: ``DataProto.concat`` of the 8 chunks (gathering worker outputs: copies 1024 rows);
* ``union``: a batch without the two log-prob tensors ``.union(`` one holding ``old_log_probs``,
  ``ref_log_prob`` and, as after a round trip through a worker, a *copy* of ``attention_mask`` and of
  ``uid`` (the shared keys are compared element by element); a fresh left side is built, untimed, before
  every call because ``union`` changes it in place;
* ``repeat``: ``batch.repeat(4, interleave=True)`` (rollout.n; 4096 rows out, about 360 MB copied);
* ``grpo``: outcome advantage (``get_adv_estimator_fn("grpo")``) on response-length tensors: rewards and
  mask (1024, 1024) (one 0/1 reward at each row's last response token, mask int64 as verl derives it from
  ``attention_mask``), ``index`` = the ``uid`` column (128 groups of 8), epsilon 1e-6, std-normalised;
* ``grpo_vectorized``: the same inputs; theirs runs verl's ``grpo_vectorized`` estimator (verl's own
  faster variant), ours runs the same ``grpo`` as above: our fastest GRPO (our own ``grpo_vectorized``
  factorises uid strings with ``np.unique``, as verl's does, and is about 0.2 ms slower here);
* ``gae``: ``get_adv_estimator_fn("gae")`` on rewards, values (float32, zero outside the mask) and mask of
  (1024, 1024), gamma 1.0, lam 1.0 (verl's defaults): a Python loop over the 1024 response positions.

Timing: inside each subprocess every op runs once untimed (warm-up; its output is also checksummed),
then at least ``--inner`` times and until ``--min-time`` seconds have passed (at most 200 calls), each
call timed alone with the garbage collector paused during the call (as ``timeit`` does); the figure of
that run is the best call (the median is kept in the JSON). A :class:`common.CpuWatch` around the timed calls records
the CPU share that other processes took meanwhile (the ``others`` columns: a figure measured while
something else used the cores is not comparable). Runs alternate sides: rep 1 ours then verl, rep 2
ours then verl, ...; the table gives, per op and side, the median over reps with the min-max spread,
the largest ``others`` share of those reps, and the ratio of the medians (ours / verl: < 1 is faster).

Threads: ``--threads`` (default 1) sets ``torch.set_num_threads`` and ``OMP_NUM_THREADS`` on both sides.
One thread is the default because on a shared 2-core box an OpenMP team of 2 stalls whenever another
process holds a core: measured here, ``DataProto.concat`` of 90 MB took 60 ms with 1 thread and 770 ms
with 2 while another engineer's training run kept both cores busy, and full-tensor code (our vectorised
GRPO) suffers while verl's per-row Python loop (tiny tensors, never parallel) does not. On a quiet
machine, ``--threads`` = the core count measures what a trainer would see.

Correctness, checked before timing (one untimed run per side) and again on every timed run: each
DataProto op's output (part lengths, key sets, shape, dtype and a blake2b digest of every tensor and
non-tensor column, meta_info) must be identical across sides and reps; advantages and returns must agree
to ``--atol`` (1e-5) on the response mask (outside it verl's GAE leaves whitened padding values and
unmasked returns, ours zeros: a documented difference, not compared). A disagreement prints ``ERROR``
lines, is recorded in the JSON, marks the table, and makes the script exit 1.

The verl venv (``ensure_verl_venv``): ``python -m venv``, then ``torch==<our torch version>`` first (so
pip never pulls another torch), ``verl==<--verl-version> --no-deps``, then only what ``verl.protocol`` and
``verl.trainer.ppo.core_algos`` need to import, found by trying (verl 0.9.1, Python 3.11):

* ``numpy`` and ``tensordict`` at the versions this interpreter has (2.3.x and 0.15.x here): the real
  dependencies; the same versions keep the comparison to the DataProto code itself. Every verl release
  on PyPI (0.7.x to 0.9.1) declares ``tensordict<=0.10.0`` and 0.7/0.8 declare ``numpy<2``; 0.9.1 declares
  ``numpy>=2`` and works with tensordict 0.15 (the outputs match ours), so it is the default;
* ``packaging``: ``verl/__init__.py`` (version parsing);
* ``ray``: ``verl/protocol.py`` imports it at module level (for ``DataProtoFuture``); it is only
  imported, never initialised. The plain ``ray`` wheel (no ``[default]`` extras) is the lightest honest
  way; a stub module would also work but would no longer be verl as shipped;
* ``omegaconf``: ``verl/utils/config.py`` (through ``verl/utils/__init__.py``);
* ``transformers`` within verl's own pin (``>=5.5.3,<5.11,!=5.6.0``): ``verl/utils/torch_functional.py``
  imports ``PreTrainedTokenizer`` at module level (for a type);
* ``codetiming``: ``verl/utils/profiler/performance.py``; ``orjson``: ``verl/utils/tracking.py``.

Not installed: accelerate, datasets, peft, pyarrow, pandas, hydra-core, wandb, tensorboard, torchdata,
ray[default] extras (none of them is imported by the two modules). pip warns about them on install.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from common import REPO, CpuWatch, fmt_share, load_avg, machine_info, median_spread, write_results

VERL_VERSION = "0.9.1"
DEFAULT_VENV = Path("~/.cache/verl/bench/venv-verl-pypi").expanduser()
# What verl.protocol and verl.trainer.ppo.core_algos import beyond numpy/tensordict/torch (module docstring).
VERL_IMPORT_DEPS = ("packaging", "ray", "omegaconf", "transformers>=5.5.3,<5.11,!=5.6.0", "codetiming", "orjson")
PROBE = "import verl, verl.protocol, verl.trainer.ppo.core_algos; print(verl.__version__)"
SIDES = ("ours", "verl")
DATAPROTO_OPS = ("chunk", "split", "concat", "union", "repeat")
ADV_OPS = ("grpo", "grpo_vectorized", "gae")
GAMMA, LAM, EPSILON = 1.0, 1.0, 1e-6
MAX_CALLS = 200


# ---------------------------------------------------------------------------------------------- verl venv
def _version(dist: str) -> str:
    """Installed version of ``dist`` in this interpreter, without a local tag (``2.13.0+cpu`` -> ``2.13.0``)."""
    return metadata.version(dist).split("+")[0]


def probe_venv(python: Path) -> str | None:
    """The verl version that ``python`` imports with both modules, or None if the import fails."""
    if not python.exists():
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, env=env, cwd="/")
    if proc.returncode != 0:
        print(f"verl venv {python}: import failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return proc.stdout.strip().splitlines()[-1]


def ensure_verl_venv(venv: Path, version: str) -> Path:
    """Create or repair the venv at ``venv`` holding ``verl==version``; return its python.

    Installs torch (our version) first, verl with ``--no-deps``, then numpy and tensordict at our versions
    and :data:`VERL_IMPORT_DEPS` (see the module docstring for why each one).

    Raises:
        RuntimeError: a pip step failed or verl still does not import afterwards.
    """
    python = venv / "bin" / "python"
    if probe_venv(python) == version:
        return python
    print(f"setting up {venv} with verl=={version} (once; a few minutes)", file=sys.stderr)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    torch_pin = f"torch=={_version('torch')}"
    pins = [torch_pin, f"numpy=={_version('numpy')}", f"tensordict=={_version('tensordict')}"]
    steps = [[torch_pin], ["--no-deps", f"verl=={version}"], [*pins, *VERL_IMPORT_DEPS]]
    for step in steps:
        cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *step]
        print("  " + " ".join(cmd[3:]), file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError(f"pip step failed: {' '.join(cmd)}")
    found = probe_venv(python)
    if found != version:
        raise RuntimeError(f"{python} imports verl {found!r} after setup, expected {version}")
    return python


# ---------------------------------------------------------------------------------------------- workload
def make_inputs(rows: int, seq_len: int, response_len: int, group: int, seed: int) -> dict[str, Any]:
    """The batch's tensors, non-tensor columns and meta_info, plus the advantage inputs (same on both sides)."""
    import uuid

    import numpy as np
    import torch

    if rows % group:
        raise ValueError(f"--rows {rows} must be a multiple of --group {group}")
    prompt_len = seq_len - response_len
    gen = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(max(1, prompt_len // 8), prompt_len + 1, (rows,), generator=gen)
    response_lengths = torch.randint(max(1, response_len // 8), response_len + 1, (rows,), generator=gen)
    prompt_mask = torch.arange(prompt_len)[None, :] >= (prompt_len - prompt_lengths)[:, None]  # left-padded
    response_mask = (torch.arange(response_len)[None, :] < response_lengths[:, None]).long()  # right-padded
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    input_ids = torch.randint(1, 151_936, (rows, seq_len), generator=gen) * attention_mask
    mask_f = response_mask.float()
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "prompts": input_ids[:, :prompt_len].clone(),
        "responses": input_ids[:, prompt_len:].clone(),
        "response_mask": response_mask,
        "old_log_probs": -5 * torch.rand(rows, response_len, generator=gen) * mask_f,
        "ref_log_prob": -5 * torch.rand(rows, response_len, generator=gen) * mask_f,
    }
    rng = np.random.default_rng(seed)
    prompt_uids = [str(uuid.UUID(bytes=rng.bytes(16))) for _ in range(rows // group)]
    uid = np.array([u for u in prompt_uids for _ in range(group)], dtype=object)
    sources = np.array(["openai/gsm8k", "lighteval/MATH"], dtype=object)
    data_source = sources[rng.integers(0, len(sources), rows)]
    scores = (torch.rand(rows, generator=gen) < 0.5).float()  # 0/1 outcome reward
    rewards = torch.zeros(rows, response_len)
    rewards[torch.arange(rows), response_lengths - 1] = scores
    values = torch.randn(rows, response_len, generator=gen) * mask_f
    return {
        "tensors": tensors,
        "non_tensors": {"uid": uid, "data_source": data_source},
        "meta_info": {"temperature": 1.0, "global_steps": 1},
        "adv": {"token_level_rewards": rewards, "values": values, "response_mask": response_mask, "index": uid},
    }


def dataproto_cases(dp_cls: Any, inputs: dict, chunks: int, split_size: int, repeat: int) -> dict[str, tuple]:
    """``{op: (setup, call)}``: ``setup()`` (untimed) returns the arguments of ``call(*args)`` (timed)."""
    tensors, non_tensors, meta = inputs["tensors"], inputs["non_tensors"], inputs["meta_info"]
    full = dp_cls.from_dict(tensors=dict(tensors), non_tensors=dict(non_tensors), meta_info=dict(meta))
    parts = full.chunk(chunks)
    right_keys = ("old_log_probs", "ref_log_prob")
    left_tensors = {k: v for k, v in tensors.items() if k not in right_keys}
    right = dp_cls.from_dict(
        tensors={**{k: tensors[k] for k in right_keys}, "attention_mask": tensors["attention_mask"].clone()},
        non_tensors={"uid": non_tensors["uid"].copy()},
        meta_info={"temperature": 1.0},
    )

    def fresh_left() -> tuple:
        left = dp_cls.from_dict(tensors=dict(left_tensors), non_tensors=dict(non_tensors), meta_info=dict(meta))
        return (left,)

    return {
        "chunk": (lambda: (full,), lambda data: data.chunk(chunks)),
        "split": (lambda: (full,), lambda data: data.split(split_size)),
        "concat": (lambda: (parts,), lambda pieces: dp_cls.concat(pieces)),
        "union": (fresh_left, lambda left: left.union(right)),
        "repeat": (lambda: (full,), lambda data: data.repeat(repeat_times=repeat, interleave=True)),
    }


def outcome_kwargs(inputs: dict) -> dict[str, Any]:
    """Keyword arguments of a GRPO-family estimator call on ``make_inputs``'s advantage inputs (both sides)."""
    a = inputs["adv"]
    return {
        "token_level_rewards": a["token_level_rewards"],
        "response_mask": a["response_mask"],
        "index": a["index"],
        "epsilon": EPSILON,
        "norm_adv_by_std_in_grpo": True,
        "config": None,
    }


def advantage_cases(get_fn: Callable[[str], Callable], inputs: dict, side: str) -> dict[str, tuple]:
    """``{op: (setup, call)}`` for the estimators; each call returns ``(advantages, returns)``."""
    a = inputs["adv"]
    outcome = outcome_kwargs(inputs)
    gae = {k: a[k] for k in ("token_level_rewards", "values", "response_mask")}
    grpo = get_fn("grpo")
    vectorized = get_fn("grpo_vectorized") if side == "verl" else grpo
    return {
        "grpo": (lambda: (), lambda: grpo(**outcome)),
        "grpo_vectorized": (lambda: (), lambda: vectorized(**outcome)),
        "gae": (lambda: (), lambda: get_fn("gae")(**gae, gamma=GAMMA, lam=LAM)),
    }


# ---------------------------------------------------------------------------------------------- checksums
def _digest(array: Any) -> str:
    """blake2b of an array's bytes (a tensor, or a numpy array: object arrays through their repr)."""
    import numpy as np

    if hasattr(array, "numpy"):
        array = array.detach().contiguous().cpu().numpy()
    if array.dtype == object:
        return hashlib.blake2b(repr(array.tolist()).encode(), digest_size=12).hexdigest()
    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8), digest_size=12).hexdigest()


def describe(output: Any) -> Any:
    """A JSON-able fingerprint of a DataProto (or a list of them): lengths, keys, shapes, dtypes, digests."""
    if isinstance(output, list | tuple):
        return [describe(part) for part in output]
    batch = {}
    if output.batch is not None:
        for key in sorted(output.batch.keys()):
            t = output.batch[key]
            batch[key] = [list(t.shape), str(t.dtype), _digest(t)]
    non_tensor = {key: [list(v.shape), str(v.dtype), _digest(v)] for key, v in sorted(output.non_tensor_batch.items())}
    meta = json.dumps(output.meta_info, sort_keys=True, default=str)
    return {"len": len(output), "batch": batch, "non_tensor": non_tensor, "meta": meta}


# ---------------------------------------------------------------------------------------------- worker
def time_case(setup: Callable, call: Callable, inner: int, min_time: float, warm: Callable | None) -> dict:
    """Warm-up call (its output goes to ``warm``), then timed calls; best/median seconds and CPU shares."""
    args = setup()
    out = call(*args)
    if warm is not None:
        warm(out)
    del out, args
    samples: list[float] = []
    gc.collect()  # once: a full collection costs tens of ms with torch and transformers loaded
    with CpuWatch() as watch:
        while inner > 0 and (len(samples) < inner or (sum(samples) < min_time and len(samples) < MAX_CALLS)):
            args = setup()
            gc.disable()
            try:
                start = time.perf_counter()
                out = call(*args)
                samples.append(time.perf_counter() - start)
            finally:
                gc.enable()
            del out, args
    best = min(samples) if samples else math.nan
    median = statistics.median(samples) if samples else math.nan
    return {"best_s": best, "median_s": median, "calls": len(samples), **watch.as_dict()}


def worker(args: argparse.Namespace) -> int:
    """One run of one side (``--worker ours|verl``): writes timings and checksums as JSON to ``--out``."""
    start = time.perf_counter()
    import numpy as np
    import torch

    import verl
    from verl.protocol import DataProto

    if args.worker == "ours":
        from verl.algorithms import get_adv_estimator_fn
    else:
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    import_s = time.perf_counter() - start
    ours_path = str(REPO / "core")
    if (args.worker == "ours") != str(Path(verl.__file__).resolve()).startswith(ours_path):
        raise RuntimeError(f"--worker {args.worker} imported the wrong verl: {verl.__file__}")
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.rows, args.seq_len, args.response_len, args.group, args.seed)
    cases = dataproto_cases(DataProto, inputs, args.chunks, args.split_size, args.repeat)
    cases.update(advantage_cases(get_adv_estimator_fn, inputs, args.worker))
    mask = inputs["adv"]["response_mask"] != 0
    arrays = Path(args.arrays) if args.arrays else None
    result: dict[str, Any] = {"side": args.worker, "import_s": import_s, "ops": {}, "fingerprints": {}}
    result["versions"] = {
        "verl": getattr(verl, "__version__", None) or metadata.version("verl-core"),
        "verl_file": verl.__file__,
        "torch": torch.__version__,
        "tensordict": metadata.version("tensordict"),
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    ops = [op for op in (*DATAPROTO_OPS, *ADV_OPS) if op in args.ops]
    for op in ops:
        setup, call = cases[op]

        def warm(out: Any, op: str = op) -> None:
            if op in ADV_OPS:
                adv, ret = out
                result["fingerprints"][op] = [list(adv.shape), str(adv.dtype)]
                if arrays is not None:
                    for name, t in (("adv", adv), ("ret", ret)):
                        np.save(arrays / f"{args.worker}-{op}-{name}.npy", t[mask].double().numpy())
            else:
                result["fingerprints"][op] = describe(out)

        result["ops"][op] = time_case(setup, call, args.inner, args.min_time, warm)
    Path(args.out).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------- driver
def run_side(side: str, python: Path, args: argparse.Namespace, out: Path, inner: int, arrays: Path | None) -> dict:
    """Run one worker subprocess for ``side`` and return its JSON (raises with its stderr if it fails)."""
    cmd = [str(python), str(Path(__file__).resolve()), "--worker", side, "--out", str(out), "--inner", str(inner)]
    for flag in ("rows", "seq_len", "response_len", "group", "chunks", "split_size", "repeat", "seed", "threads"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--min-time", str(args.min_time), "--ops", *args.ops]
    if arrays is not None:
        cmd += ["--arrays", str(arrays)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO))
    if proc.returncode != 0:
        raise RuntimeError(f"{side} worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def compare(check: dict[str, dict], arrays: Path, atol: float) -> dict[str, Any]:
    """Compare the check runs of both sides: DataProto fingerprints exactly, advantages to ``atol``."""
    import numpy as np

    ours, theirs = check["ours"], check["verl"]
    report: dict[str, Any] = {"errors": [], "max_abs_diff": {}}
    for op in ours["fingerprints"]:
        if ours["fingerprints"][op] != theirs["fingerprints"].get(op):
            report["errors"].append(f"{op}: outputs differ (ours {ours['fingerprints'][op]!s:.300} ...)")
        if op in ADV_OPS:
            for name in ("adv", "ret"):
                a = np.load(arrays / f"ours-{op}-{name}.npy")
                b = np.load(arrays / f"verl-{op}-{name}.npy")
                diff = float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else math.inf
                report["max_abs_diff"][f"{op}.{name}"] = diff
                if not diff <= atol:
                    report["errors"].append(f"{op}: {name} differ by up to {diff:.3g} (> {atol}) on the mask")
    return report


def summarise(runs: dict[str, list[dict]], ops: list[str]) -> list[dict]:
    """Per op: median (min-max) over reps of each side's best-call seconds, worst others share, ratio."""
    rows = []
    for op in ops:
        row: dict[str, Any] = {"op": op}
        for side in SIDES:
            per_rep = [r["ops"][op] for r in runs[side]]
            median, lo, hi = median_spread([m["best_s"] for m in per_rep])
            row[side] = {
                "median_s": median,
                "min_s": lo,
                "max_s": hi,
                "others_cpu_max": max(m["others_cpu"] for m in per_rep),
                "steal_cpu_max": max(m["steal_cpu"] for m in per_rep),
                "reps": per_rep,
            }
        row["ratio_ours_over_verl"] = row["ours"]["median_s"] / row["verl"]["median_s"]
        rows.append(row)
    return rows


def describe_op(op: str, a: argparse.Namespace) -> str:
    """What an op does at the chosen sizes, for the table."""
    n_groups = a.rows // a.group
    return {
        "chunk": f"{a.rows} rows -> {a.chunks} chunks",
        "split": f"{a.rows} rows -> pieces of {a.split_size}",
        "concat": f"{a.chunks} x {a.rows // a.chunks} rows -> {a.rows}",
        "union": "+2 float32 keys, 2 shared keys compared",
        "repeat": f"x{a.repeat} interleave -> {a.rows * a.repeat} rows",
        "grpo": f"({a.rows}, {a.response_len}), {n_groups} groups of {a.group}",
        "grpo_vectorized": "same; verl: grpo_vectorized, ours: grpo",
        "gae": f"({a.rows}, {a.response_len}), gamma {GAMMA}, lam {LAM}",
    }[op]


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with 3 significant digits."""
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def markdown(result: dict) -> str:
    """The comparison table with a header of settings, versions and machine facts."""
    s, m, v = result["settings"], result["machine"], result["versions"]
    check = result["check"]
    verdict = "outputs identical, advantages within atol" if not check["errors"] else "MISMATCH (see ERROR lines)"
    diffs = ", ".join(f"{k} {d:.1e}" for k, d in check["max_abs_diff"].items())
    lines = [
        f"machine: {m['cpu']} ({m['cores']} cores, {m['isa']}), {s['threads']} torch threads, python "
        f"{m['python']}; load average {result['load_avg_start']} -> {result['load_avg_end']}",
        f"ours: verl-core {v['ours']['verl']} | verl: {v['verl']['verl']} (PyPI) | torch {v['ours']['torch']}, "
        f"tensordict {v['ours']['tensordict']} / {v['verl']['tensordict']}, numpy {v['ours']['numpy']} / "
        f"{v['verl']['numpy']}; import s: ours {result['import_s']['ours']:.1f}, verl {result['import_s']['verl']:.1f}",
        f"batch {s['rows']} rows x {s['seq_len']} tokens (response {s['response_len']}), seed {s['seed']}; "
        f"{s['reps']} reps alternating ours, verl; figure = best of >= {s['inner']} calls "
        f"(>= {s['min_time']} s) per run; median (min-max) over reps",
        f"check: {verdict}; max |diff| on the mask: {diffs}",
        "",
        "| op | what | ours ms | others CPU | verl ms | others CPU | ours / verl |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = []
        for side in SIDES:
            x = r[side]
            cells += [
                f"{fmt_ms(x['median_s'])} ({fmt_ms(x['min_s'])}-{fmt_ms(x['max_s'])})",
                fmt_share(x["others_cpu_max"]),
            ]
        lines.append(f"| {r['op']} | {r['what']} | {' | '.join(cells)} | {r['ratio_ours_over_verl']:.2f} |")
    lines.append("")
    lines.append("others CPU: the largest share of the machine that other processes used during a side's timed calls.")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> int:
    """Set up the verl venv, check both sides agree, run the alternating reps, print and write the table."""
    python = {"ours": Path(sys.executable), "verl": ensure_verl_venv(args.verl_venv.expanduser(), args.verl_version)}
    load_start = load_avg()
    info = machine_info()
    info["torch_threads"] = args.threads
    with tempfile.TemporaryDirectory(prefix="verl-bench-protocol-") as tmp_dir:
        tmp = Path(tmp_dir)
        arrays = tmp / "arrays"
        arrays.mkdir()
        check = {}
        for side in SIDES:
            print(f"check run: {side}", file=sys.stderr)
            check[side] = run_side(side, python[side], args, tmp / f"check-{side}.json", 0, arrays)
        report = compare(check, arrays, args.atol)
    for error in report["errors"]:
        print(f"ERROR: {error}", file=sys.stderr)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="verl-bench-protocol-") as tmp_dir:
        for rep in range(args.reps):
            for side in SIDES:
                run = run_side(side, python[side], args, Path(tmp_dir) / f"{side}-{rep}.json", args.inner, None)
                if run["fingerprints"] != check[side]["fingerprints"]:
                    report["errors"].append(f"{side} rep {rep + 1}: outputs differ from its check run")
                    print(f"ERROR: {report['errors'][-1]}", file=sys.stderr)
                runs[side].append(run)
                summary = ", ".join(f"{op} {1e3 * t['best_s']:.2f} ms" for op, t in run["ops"].items())
                print(f"rep {rep + 1} {side:4s}: {summary}", file=sys.stderr)
    rows = summarise(runs, [op for op in (*DATAPROTO_OPS, *ADV_OPS) if op in args.ops])
    for row in rows:
        row["what"] = describe_op(row["op"], args)
    settings = {k: getattr(args, k) for k in ("rows", "seq_len", "response_len", "group", "chunks", "split_size")}
    settings |= {k: getattr(args, k) for k in ("repeat", "seed", "threads", "reps", "inner", "min_time", "atol")}
    result = {
        "benchmark": "protocol",
        "settings": settings,
        "machine": info,
        "versions": {side: check[side]["versions"] for side in SIDES},
        "import_s": {side: statistics.median(r["import_s"] for r in runs[side]) for side in SIDES},
        "verl_venv": str(python["verl"]),
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "check": report,
        "rows": rows,
    }
    write_results(result, markdown(result), args.json, args.md)
    return 1 if report["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="alternating runs per side")
    parser.add_argument("--inner", type=int, default=5, help="timed calls per op and run, at least")
    parser.add_argument("--min-time", type=float, default=0.2, help="keep calling an op until this many seconds")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=2048, help="prompt + response tokens")
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (rows sharing a uid)")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--split-size", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads on both sides (see docstring)")
    parser.add_argument("--ops", nargs="+", default=[*DATAPROTO_OPS, *ADV_OPS], choices=[*DATAPROTO_OPS, *ADV_OPS])
    parser.add_argument("--atol", type=float, default=1e-5, help="advantage/return tolerance across sides")
    parser.add_argument("--verl-venv", type=Path, default=DEFAULT_VENV, help="venv with verl from PyPI")
    parser.add_argument("--verl-version", default=VERL_VERSION, help="verl release to install there")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--md", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--worker", choices=SIDES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--arrays", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    raise SystemExit(main())
