"""LoRA GRPO with the vLLM rollout: the adapter served by vLLM (``model.lora.merge=false``) vs merged weights.

    .nox/plugin-vllm/bin/python benchmarks/lora_rollout.py --steps 3 --reps 2 --md benchmarks/results/lora_rollout.md

Both sides are one ``verl train`` process each at ``benchmarks/grpo_step.py``'s ``ours-vllm`` settings (8 prompts x
4 samples, <= 128 new tokens, SmolLM2-135M-Instruct, fp32) plus LoRA r = 16, alpha = 32, ``all-linear``, with
``actor_rollout_ref.model.lora.merge=false`` (adapter) or ``=true`` (merged). Reps alternate sides (adapter,
merged, adapter, ...) so drifts in machine load hit both. Per side: medians over the counted steps (step 1 is warm-up) of the step, ``gen`` and
``update_weights`` seconds and the bytes each sync moves. Needs vLLM (the ``plugin(vllm)`` nox venv).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_step  # noqa: E402
from common import load_avg, machine_info, write_results  # noqa: E402

LORA = [
    "actor_rollout_ref.model.lora_rank=16",
    "actor_rollout_ref.model.lora_alpha=32",
    "actor_rollout_ref.model.target_modules=all-linear",
]
SIDES = {
    "adapter": [*LORA, "actor_rollout_ref.model.lora.merge=false"],
    "merged": [*LORA, "actor_rollout_ref.model.lora.merge=true"],
}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(runs: list[dict]) -> list[dict]:
    """Per side: median step / gen / update_weights seconds over counted steps, and the sync's bytes per step."""
    out = []
    for side in SIDES:
        counted = [s for r in runs if r["label_side"] == side for s in r["steps"][1:]]
        out.append(
            {
                "side": side,
                "steps": len(counted),
                "step_s": _median([s["seconds"] for s in counted]),
                "gen_s": _median([s["stages"]["gen"] for s in counted]),
                "update_weights_s": _median([s["stages"]["update_weights"] for s in counted]),
                "sync_MB": _median([s.get("sync_bytes", float("nan")) / 1e6 for s in counted]),
                "tokens_per_gen_s": _median([s["response_tokens"] / s["stages"]["gen"] for s in counted]),
                "exits": [r["returncode"] for r in runs if r["label_side"] == side],
            }
        )
    return out


def markdown(result: dict) -> str:
    rows = {r["side"]: r for r in result["summary"]}
    lines = [
        f"machine: {result['cpu']}; load average {result['load_start']} -> {result['load_end']}",
        f"protocol: grpo_step.py ours-vllm settings + LoRA r=16 alpha=32 all-linear; {result['steps']} steps per "
        f"process (step 1 warm-up), {result['reps']} processes per side, alternating",
        "",
        "| side | counted steps | s/step | gen s | gen tokens/s | update_weights s | MB per sync | exits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['side']} | {r['steps']} | {r['step_s']:.1f} | {r['gen_s']:.1f} | {r['tokens_per_gen_s']:.0f} | "
            f"{r['update_weights_s']:.2f} | {r['sync_MB']:.1f} | {r['exits']} |"
        )
    a, m = rows["adapter"], rows["merged"]
    lines += [
        "",
        f"adapter / merged: step {a['step_s'] / m['step_s']:.2f}x, gen {a['gen_s'] / m['gen_s']:.2f}x, "
        f"update_weights {a['update_weights_s'] / m['update_weights_s']:.2f}x, bytes per sync "
        f"{a['sync_MB'] / m['sync_MB']:.3f}x",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per process (the first is warm-up)")
    parser.add_argument("--reps", type=int, default=2, help="processes per side, alternating sides")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is warm-up)")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="verl_lora_rollout_"))
    work.mkdir(parents=True, exist_ok=True)
    data = grpo_step.prepare_data(work, grpo_step.PROMPTS_PER_STEP * args.steps)
    load_start = load_avg()
    runs = []
    for rep in range(1, args.reps + 1):
        for side, extra in SIDES.items():
            run = grpo_step.run_ours("ours-vllm", rep, data, args, work, extra=extra, label=f"{side}-rep{rep}")
            run["label_side"] = side
            metrics = work / f"{side}-rep{rep}" / "run" / "metrics.jsonl"
            records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
            for step, rec in zip(run["steps"], records, strict=False):
                step["sync_bytes"] = rec.get("weight_sync/bytes", float("nan"))
            runs.append(run)
            secs = " ".join(f"{s['seconds']:.1f}" for s in run["steps"])
            print(f"{side} rep {rep}: exit {run['returncode']} steps [{secs}] s", file=sys.stderr)
            if run["returncode"] != 0:
                print(grpo_step.tail(run["log"]), file=sys.stderr)
    info = machine_info()
    result = {
        "benchmark": "lora_rollout",
        "cpu": f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores",
        "load_start": load_start,
        "load_end": load_avg(),
        "steps": args.steps,
        "reps": args.reps,
        "summary": summarize(runs),
        "runs": [{k: v for k, v in r.items() if k not in ("resolved_config",)} for r in runs],
    }
    write_results(json.loads(json.dumps(result, default=str)), markdown(result), args.json, args.md)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
