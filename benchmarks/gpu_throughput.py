"""GRPO throughput on one GPU: our ``verl train`` per engine pair, and verl 0.9's ``main_ppo`` where it is installed.

    scripts/gpu_throughput.sh                                  # on the GPU machine: environment, then this script
    python benchmarks/gpu_throughput.py --size 0.5b --steps 3 --out runs/gpu_throughput

Model: built from a Llama config on the machine itself (no hub download): ``0.5b`` (hidden 1280, 26 layers, GQA 20/4
heads, MLP 3584: 0.52 B parameters with SmolLM2's 49152-token vocabulary) or ``1.2b`` (hidden 2048, 24 layers, 32/8
heads, MLP 5632: 1.18 B), seeded random weights saved in bf16, with the tokenizer of ``--tokenizer`` (SmolLM2's: the
wrapper carries it). ``tiny`` (2 layers, hidden 128) is the CPU dry run that ``benchmarks/tests`` use to check this
script. Random weights rarely emit EOS, so nearly every response runs to ``--response-length`` tokens: the work per
step is fixed, which is what a throughput figure wants.

Data: the shipped GSM8K rows (``verl data gsm8k``). Each side is one process running ``--steps`` GRPO steps of
``--prompts`` prompts x ``--n`` samples (step 1 is warm-up and not counted), one update per step
(``ppo_mini_batch_size`` = the batch), no KL loss (no reference model), dynamic micro-batches of
``--token-budget`` tokens, gradient checkpointing on, validation and checkpoints off.

Sides (``--sides``, default every pair whose libraries import here): ``ours-<training>-<rollout>`` with training
``reference`` (one-process engine, bf16 weights) or ``fsdp`` (FSDP2 on one rank, fp32 master weights, bf16 compute)
and rollout ``vllm`` or ``hf``; ``verl`` = verl 0.9's ``python -m verl.trainer.main_ppo`` with the same keys, run by
``--verl-python`` (an interpreter whose environment holds ``verl==0.9.*`` and vLLM; upstream's import name is also
``verl``, so it cannot share ours). A side that cannot run here is reported with the reason, never dropped silently.

Figures per side, medians over the counted steps: seconds per step, ``perf/throughput`` (prompt + response tokens
per second per GPU, verl's metric: every side computes it the same way), the split of the step into generation,
log-prob passes, update and weight sync (``timing_s/*``), response tokens, peak GPU memory, and start-up seconds
(launch to the end of step 1 minus step 1).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: Llama configs by size: (hidden, layers, heads, kv heads, intermediate).
SIZES = {
    "tiny": (128, 2, 2, 1, 256),
    "0.5b": (1280, 26, 20, 4, 3584),
    "1.2b": (2048, 24, 32, 8, 5632),
}
STAGES = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
ALL_SIDES = ("ours-reference-vllm", "ours-fsdp-vllm", "ours-reference-hf", "ours-fsdp-hf", "verl")


def build_model(size: str, tokenizer: Path, out: Path, seed: int = 0) -> dict[str, Any]:
    """Write a seeded random Llama of ``size`` (bf16) with ``tokenizer`` at ``out``; returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    hidden, layers, heads, kv_heads, inter = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"size": size, "params": sum(p.numel() for p in model.parameters()), "config": config.to_dict()}


def available_sides(requested: list[str], verl_python: str | None) -> dict[str, str | None]:
    """``{side: None (runs) or the reason it cannot run here}``."""
    have = {name: find_spec(name) is not None for name in ("vllm", "verl_vllm", "verl_fsdp")}
    reasons: dict[str, str | None] = {}
    for side in requested:
        if side == "verl":
            if not verl_python:
                reasons[side] = "no --verl-python (an environment with verl==0.9.* and vLLM) on this machine"
            else:
                probe = subprocess.run(
                    [verl_python, "-c", "import verl, vllm; print(verl.__version__)"], capture_output=True, text=True
                )
                reasons[side] = None if probe.returncode == 0 else f"verl/vllm do not import: {probe.stderr[-300:]}"
            continue
        _, training, rollout = side.split("-")
        if rollout == "vllm" and not (have["vllm"] and have["verl_vllm"]):
            reasons[side] = "vLLM (or the verl-vllm plugin) is not installed here"
        elif training == "fsdp" and not have["verl_fsdp"]:
            reasons[side] = "the verl-fsdp plugin is not installed here"
        else:
            reasons[side] = None
    return reasons


def common_keys(args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    """The keys both implementations take, verl's names and values."""
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_files": str(data / "train.parquet"),
        "data.val_files": str(data / "test.parquet"),
        "data.train_batch_size": args.prompts,
        "data.max_prompt_length": args.prompt_length,
        "data.max_response_length": args.response_length,
        "data.filter_overlong_prompts": True,
        "actor_rollout_ref.model.path": str(model),
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.actor.ppo_mini_batch_size": args.prompts,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": args.token_budget,
        "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.optim.lr": 1e-6,
        "actor_rollout_ref.rollout.n": args.n,
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": args.token_budget,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "trainer.n_gpus_per_node": 1,
        "trainer.nnodes": 1,
        "trainer.total_training_steps": args.steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
    }


def our_command(side: str, args: argparse.Namespace, model: Path, data: Path, run: Path) -> list[str]:
    _, training, rollout = side.split("-")
    keys = common_keys(args, model, data)
    keys.update(
        {
            "actor_rollout_ref.actor.strategy": training,
            "actor_rollout_ref.rollout.name": rollout,
            "trainer.device": args.device,
            "trainer.logger": "[file]",
            "trainer.default_local_dir": str(run / "checkpoints"),
        }
    )
    if rollout == "vllm" and args.device != "cpu":  # on a CPU vLLM's KV cache is sized in GiB instead
        keys["actor_rollout_ref.rollout.gpu_memory_utilization"] = args.gpu_memory_utilization
    if args.device != "cpu":
        keys["actor_rollout_ref.rollout.dtype"] = "bfloat16"
        if training == "fsdp":  # fp32 master weights, bf16 compute (verl's FSDP default)
            keys["actor_rollout_ref.actor.fsdp_config.mixed_precision"] = "{param_dtype: bf16, reduce_dtype: fp32}"
        else:
            keys["actor_rollout_ref.actor.fsdp_config.model_dtype"] = "bf16"
    overrides = [f"{k}={_value(v)}" for k, v in keys.items()]
    verl = Path(sys.executable).parent / "verl"
    head = [str(verl)] if verl.exists() else [sys.executable, "-m", "verl.cli.main"]
    return [*head, "train", "--schema-defaults", *overrides, "--run-dir", str(run)]


def verl_command(args: argparse.Namespace, model: Path, data: Path, run: Path) -> list[str]:
    keys = common_keys(args, model, data)
    keys.update(
        {
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.actor.strategy": "fsdp2",
            "actor_rollout_ref.rollout.gpu_memory_utilization": args.gpu_memory_utilization,
            "trainer.logger": "[console]",
            "trainer.project_name": "gpu_throughput",
            "trainer.experiment_name": "verl",
            "trainer.default_local_dir": str(run / "checkpoints"),
        }
    )
    return [args.verl_python, "-m", "verl.trainer.main_ppo", *(f"{k}={_value(v)}" for k, v in keys.items())]


def _value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


_VERL_STEP = re.compile(r"step:(\d+) - (.*)")


def read_steps(side: str, run: Path, log: Path) -> list[dict[str, float]]:
    """Per-step metrics: ours from ``metrics.jsonl``; verl's from its console lines (``step:N - key:value - ...``)."""
    if side != "verl":
        path = run / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [r for r in rows if "timing_s/step" in r]
    steps = []
    for line in log.read_text(errors="replace").splitlines():
        match = _VERL_STEP.search(line)
        if not match:
            continue
        row: dict[str, float] = {"step": float(match.group(1))}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            try:
                row[key.strip()] = float(value)
            except ValueError:
                continue
        steps.append(row)
    return steps


def run_side(side: str, args: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    run = args.work / side
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    cmd = verl_command(args, model, data, run) if side == "verl" else our_command(side, args, model, data, run)
    log = run / "train.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.time()
    with open(log, "w") as out:
        try:
            rc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=args.side_timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.time() - started
    shutil.copy(log, args.out / f"{side}.log")
    steps = read_steps(side, run, log)
    counted = steps[1:]

    def median(key: str) -> float | None:
        values = [s[key] for s in counted if key in s]
        return statistics.median(values) if values else None

    peak = [v for s in steps for k, v in s.items() if k.startswith("memory/") and k.endswith("peak_allocated_gb")]
    first = steps[0]["timing_s/step"] if steps else None
    return {
        "side": side,
        "cmd": cmd,
        "returncode": rc,
        "wall_s": wall,
        "steps": len(steps),
        "step_s": median("timing_s/step"),
        "throughput": median("perf/throughput"),
        "response_length": median("response_length/mean"),
        "stages": {stage: median(f"timing_s/{stage}") for stage in STAGES},
        "peak_gpu_gb": max(peak) if peak else None,
        "startup_s": (wall - sum(s["timing_s/step"] for s in steps)) if steps else None,
        "first_step_s": first,
        "log_tail": "" if rc == 0 else "\n".join(log.read_text(errors="replace").splitlines()[-25:]),
    }


def markdown(result: dict[str, Any]) -> str:
    def f(x: Any, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    a = result["args"]
    lines = [
        f"machine: {result['machine']}",
        f"model: {a['size']} ({result['model']['params'] / 1e9:.2f} B parameters, random weights, bf16 on disk); "
        f"{a['prompts']} prompts x n={a['n']}, <= {a['response_length']} new tokens, {a['steps']} steps per side "
        "(step 1 warm-up)",
        "",
        "| side | s/step | tokens/s/GPU | gen s | old_log_prob s | update_actor s | update_weights s | "
        "response tokens | peak device GB | start-up s | exit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        st = r["stages"]
        lines.append(
            f"| {r['side']} | {f(r['step_s'])} | {f(r['throughput'], '.0f')} | {f(st['gen'])} | "
            f"{f(st['old_log_prob'])} | {f(st['update_actor'])} | {f(st['update_weights'], '.2f')} | "
            f"{f(r['response_length'], '.0f')} | {f(r['peak_gpu_gb'])} | {f(r['startup_s'])} | {r['returncode']} |"
        )
    for side, why in result["not_run"].items():
        lines.append(f"| {side} | not run: {why} |")
    return "\n".join(lines)


def machine() -> str:
    import platform

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{gpu}; torch {torch.__version__}; python {platform.python_version()}; {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--tokenizer", type=Path, default=REPO / ".gpu_bench" / "tokenizer")
    parser.add_argument("--sides", nargs="+", choices=ALL_SIDES, default=list(ALL_SIDES))
    parser.add_argument("--verl-python", default=os.environ.get("VERL_PYTHON"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--side-timeout", type=float, default=300.0, help="seconds per side before it is stopped")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "gpu_throughput", help="results (md, json)")
    parser.add_argument(
        "--work", type=Path, default=None, help="model, data and run folders (default OUT/work); keep it off $OUT"
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (step 1 is warm-up)")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or args.out / "work"
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.tokenizer / "tokenizer.json").exists() and not (args.tokenizer / "tokenizer_config.json").exists():
        parser.error(
            f"--tokenizer {args.tokenizer}: no tokenizer files (scripts/gpu_throughput.sh --prepare copies them)"
        )
    model = args.work / f"model-{args.size}"
    info = build_model(args.size, args.tokenizer, model)
    print(f"model {args.size}: {info['params'] / 1e9:.3f} B parameters at {model}", file=sys.stderr)
    data = args.work / "data"
    subprocess.run([sys.executable, "-m", "verl.cli.main", "data", "gsm8k", "--out", str(data)], check=True)
    reasons = available_sides(args.sides, args.verl_python)
    runs = []
    for side in args.sides:
        if reasons[side] is not None:
            print(f"{side}: not run: {reasons[side]}", file=sys.stderr)
            continue
        run = run_side(side, args, model, data)
        runs.append(run)
        print(f"{side}: exit {run['returncode']}, {run['steps']} steps, {run['step_s']} s/step", file=sys.stderr)
        if run["returncode"]:
            print(run["log_tail"], file=sys.stderr)
    result = {
        "benchmark": "gpu_throughput",
        "machine": machine(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": {k: v for k, v in info.items() if k != "config"},
        "runs": runs,
        "not_run": {side: why for side, why in reasons.items() if why is not None},
    }
    (args.out / "gpu_throughput.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.out / "gpu_throughput.md").write_text(text + "\n")
    print(text)
    return 0 if runs and all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
