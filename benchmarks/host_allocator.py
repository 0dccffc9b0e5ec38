"""The cpu platform's host allocator policy: ``VERL_CPU_ALLOCATOR=caching`` (the default) vs ``system``, per stage.

    .nox/plugin-vllm/bin/python benchmarks/host_allocator.py --engines hf vllm --steps 3 \
        --json benchmarks/results/host_allocator.json --md benchmarks/results/host_allocator.md

Each (engine, policy) runs in its own process (the policy is process-wide and applied once), pairs alternate
(system, caching for ``hf``, then for ``vllm``, per rep). A process does what a colocated CPU worker does per GRPO
step, in one process as ``verl train`` does: the rollout engine generates 128 new tokens for 32 GSM8K prompts,
then core's ``reference`` training engine computes the old log-probs and trains (``train_batch``, one mini-batch)
on ``train.py``'s batch (the same prompts with their reference solutions as responses, the example config's
token budgets), then the new weights go to the rollout engine. The platform's ``configure_allocator()`` runs
first, as a worker's ``init_model`` does.

Per stage it records wall seconds, minor page faults (``getrusage``: each is one 4 KiB page the kernel zero-fills
and maps on first touch) and system CPU seconds; per process the peak RSS (``VmHWM``). Step 1 is a warm-up
(the heap grows to its working size there) and is not counted; the table has medians over the rest.
``vllm`` needs the ``verl-vllm`` plugin (run it with the plugin(vllm) nox venv's Python, after reinstalling core
there if core changed: ``pip install --no-deps ./core ./plugins/verl-vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

POLICIES = ("system", "caching")
STAGES = ("gen", "old_log_prob", "update_actor", "update_weights")
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def child(engine_kind: str, steps: int, threads: int) -> None:
    """One process: ``steps`` rounds of generate / log-probs / update / weight sync; one JSON line per stage."""
    import torch

    torch.set_num_threads(threads)
    from verl.platform.cpu import CpuPlatform

    policy = CpuPlatform().configure_allocator()
    import rollout
    import train

    from verl.config import load_config
    from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
    from verl.models import load_tokenizer, resolve_model_path
    from verl.protocol import DataProto
    from verl.workers.losses import make_ppo_loss

    path = resolve_model_path(common.MODEL)
    tokenizer = load_tokenizer(path)
    data = train.build_batch(tokenizer, 32, 256, 128)
    settings = EngineSettings(
        mini_batch_size=32,
        use_dynamic_bsz=True,
        max_token_len=512,
        infer_use_dynamic_bsz=True,
        infer_max_token_len=1024,
        use_remove_padding=True,
    )
    cfg = load_config(None)
    trainer = ReferenceTrainingEngine(path, settings, optim=cfg.actor_rollout_ref.actor.optim, total_training_steps=100)
    loss_fn = make_ppo_loss(cfg.actor_rollout_ref.actor)
    ns = argparse.Namespace(response_length=128, max_prompt_length=256, device="cpu")
    roll, _ = rollout.build_engine(engine_kind, path, tokenizer, ns)
    prompts = rollout.prompt_batches(tokenizer, [32], 256)[32]
    batch = DataProto.from_dict(tensors={k: prompts.batch[k] for k in prompts.batch.keys()})

    def stage(step: int, name: str, fn: Any) -> Any:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        rec = {
            "policy": policy,
            "step": step,
            "stage": name,
            "seconds": seconds,
            "faults": r1.ru_minflt - r0.ru_minflt,
            "sys_s": r1.ru_stime - r0.ru_stime,
            "user_s": r1.ru_utime - r0.ru_utime,
        }
        print("RESULT " + json.dumps(rec), flush=True)
        return out

    for step in range(1, steps + 1):
        stage(step, "gen", lambda: roll.generate(batch))
        old = stage(step, "old_log_prob", lambda: trainer.compute_log_prob(data))
        data.batch["old_log_probs"] = old.batch["old_log_probs"]
        stage(step, "update_actor", lambda: trainer.train_batch(data, loss_fn))
        stage(step, "update_weights", lambda: roll.update_weights(trainer.iter_weights()))
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print("RESULT " + json.dumps({"policy": policy, "peak_rss_bytes": peak}), flush=True)


def run_one(engine_kind: str, policy: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, VERL_CPU_ALLOCATOR=policy, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1")
    if engine_kind == "vllm":
        env.update(VLLM_ENV)
    cmd = [sys.executable, __file__, "--child", engine_kind, "--steps", str(args.steps), "--threads", str(args.threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{engine_kind}/{policy} exited {out.returncode}:\n{out.stderr[-3000:]}")
    recs = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    applied = recs[0]["policy"]
    if applied != policy:
        raise RuntimeError(f"{engine_kind}: asked for {policy!r}, the platform applied {applied!r}")
    return {"engine": engine_kind, "policy": policy, "stages": recs[:-1], "peak_rss_bytes": recs[-1]["peak_rss_bytes"]}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for engine_kind in dict.fromkeys(r["engine"] for r in runs):
        for policy in POLICIES:
            mine = [r for r in runs if r["engine"] == engine_kind and r["policy"] == policy]
            if not mine:
                continue
            row: dict[str, Any] = {"engine": engine_kind, "policy": policy}
            for name in STAGES:
                recs = [s for r in mine for s in r["stages"] if s["stage"] == name and s["step"] > 1]
                for key in ("seconds", "faults", "sys_s"):
                    row[f"{name}/{key}"] = statistics.median(s[key] for s in recs) if recs else float("nan")
            steps = {}
            for r in mine:
                for s in r["stages"]:
                    if s["step"] > 1:
                        steps[(id(r), s["step"])] = steps.get((id(r), s["step"]), 0.0) + s["seconds"]
            row["step_s"] = statistics.median(steps.values()) if steps else float("nan")
            row["peak_rss_gb"] = max(r["peak_rss_bytes"] for r in mine) / 1e9
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, info: dict[str, Any]) -> str:
    lines = [
        "# Host allocator policy per stage (`benchmarks/host_allocator.py`)\n",
        f"machine: {info['cpu']} ({info['isa']}), {info['cores']} cores; threads per process {args.threads}; "
        f"{args.steps} steps per process (step 1 = warm-up, not counted), {args.reps} rep(s), policies alternating\n",
        "Per stage: median wall s / minor page faults / system CPU s. step = the four stages' sum (median).\n",
        "| engine | policy | gen | old_log_prob | update_actor | update_weights | step s | peak RSS GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[f'{n}/seconds']:.2f} / {r[f'{n}/faults']:,.0f} / {r[f'{n}/sys_s']:.2f}" for n in STAGES]
        lines.append(
            f"| {r['engine']} | {r['policy']} | "
            + " | ".join(cells)
            + f" | {r['step_s']:.2f} | {r['peak_rss_gb']:.2f} |"
        )
    by = {(r["engine"], r["policy"]): r for r in rows}
    lines.append("")
    for engine_kind in dict.fromkeys(r["engine"] for r in rows):
        a, b = by.get((engine_kind, "system")), by.get((engine_kind, "caching"))
        if a and b:
            lines.append(
                f"- {engine_kind}: step {a['step_s']:.2f} -> {b['step_s']:.2f} s ({a['step_s'] / b['step_s']:.3f}x), "
                f"update {a['update_actor/seconds']:.2f} -> {b['update_actor/seconds']:.2f} s, peak RSS "
                f"{a['peak_rss_gb']:.2f} -> {b['peak_rss_gb']:.2f} GB"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--steps", type=int, default=3, help="steps per process (the first is warm-up)")
    parser.add_argument("--reps", type=int, default=1, help="processes per (engine, policy)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    parser.add_argument("--child", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is a warm-up)")
    if args.child:
        child(args.child, args.steps, args.threads)
        return 0
    runs = []
    for rep in range(1, args.reps + 1):
        for engine_kind in args.engines:
            for policy in POLICIES:
                run = run_one(engine_kind, policy, args)
                run["rep"] = rep
                step_s = [s["seconds"] for s in run["stages"] if s["stage"] == "update_actor"]
                print(
                    f"rep {rep} {engine_kind:5s} {policy:8s} update_actor {[round(x, 2) for x in step_s]} s, "
                    f"peak RSS {run['peak_rss_bytes'] / 1e9:.2f} GB",
                    flush=True,
                )
                runs.append(run)
    info = common.machine_info()
    rows = summarize(runs)
    result = {
        "benchmark": "host_allocator",
        "machine_info": info,
        "args": vars(args) | {"json": None, "md": None},
        "summary": rows,
        "runs": runs,
    }
    common.write_results(result, markdown(rows, args, info), args.json, args.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
