"""``verl train`` start-up (launch to the start of step 1) with the prompt cache cold and warm.

    python benchmarks/startup.py --reps 3 --md benchmarks/results/startup.md

Each run is the shipped GSM8K example (`examples/gsm8k_grpo_smollm2_cpu.yaml`: 8791 prompts tokenised and checked
before training) cut to one tiny step (1 prompt, 1 sample, 1 new token, no validation, no checkpoint), so nearly
all of its wall time is start-up. ``cold``: ``VERL_PROMPT_CACHE=0`` (every prompt encoded, as before the cache);
``warm``: the cache holds the prompts (a priming run, not counted, fills it). Reps alternate cold, warm, cold, ...
Start-up = the moment step 1's metrics line appears minus the launch and minus ``timing_s/step``.
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

KEYS = [
    "trainer.total_training_steps=1",
    "data.train_batch_size=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.rollout.n=1",
    "data.max_response_length=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[file]",
]


def one_run(side: str, work: Path, args: argparse.Namespace) -> dict:
    run_dir = work / f"{side}-{len(list(work.glob(side + '-*')))}"
    verl = Path(sys.executable).parent / "verl"
    cmd = [
        str(verl) if verl.exists() else "verl",
        "train",
        str(grpo_step.EXAMPLE),
        *KEYS,
        "--run-dir",
        str(run_dir / "run"),
    ]
    env = grpo_step.child_env(args, {"VERL_PROMPT_CACHE": "0" if side == "cold" else "1"})
    run_dir.mkdir(parents=True)
    run = grpo_step.run_child(cmd, run_dir, env, run_dir / "train.log", watch_file=run_dir / "run" / "metrics.jsonl")
    rows = [json.loads(x) for x in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    startup = run["line_seen"][0] - run["t_launch"] - rows[0]["timing_s/step"]
    return {"side": side, "returncode": run["returncode"], "startup_s": startup, "wall_s": run["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="verl_startup_"))
    load_start = load_avg()
    one_run("warm", work, args)  # priming: fills the cache (and converts the model once if needed); not counted
    runs = [one_run(side, work, args) for _ in range(args.reps) for side in ("cold", "warm")]
    summary = {side: statistics.median(r["startup_s"] for r in runs if r["side"] == side) for side in ("cold", "warm")}
    info = machine_info()
    lines = [
        f"machine: {info['cpu']}, {info['cores']} cores, {args.threads} threads; load average {load_start} -> "
        f"{load_avg()}",
        "",
        "| prompt cache | start-up s (median) | runs |",
        "|---|---|---|",
        *(
            f"| {side} | {summary[side]:.2f} | "
            + ", ".join(f"{r['startup_s']:.2f}" for r in runs if r["side"] == side)
            + " |"
            for side in ("cold", "warm")
        ),
        "",
        f"warm - cold: {summary['warm'] - summary['cold']:+.2f} s",
    ]
    result = {"benchmark": "startup", "machine": info, "runs": runs, "median_startup_s": summary}
    write_results(result, "\n".join(lines), args.json, args.md)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
