"""Rollout throughput: core's ``hf`` engine vs the rollout plugins on the same GSM8K prompts, plus the roofline.

    OMP_NUM_THREADS=2 python benchmarks/rollout.py --batch-sizes 8 32 --reps 3 --json benchmarks/results/rollout.json \
        --md benchmarks/results/rollout.md
    # on one NVIDIA GPU with the plugins' [cuda] extras installed (every engine in bfloat16 there):
    python benchmarks/rollout.py --device cuda --engines hf vllm sglang trtllm --batch-sizes 32 64 256
    # server-based rollout (rollout.mode=async) against the batched call, same engines, same prompts:
    OMP_NUM_THREADS=2 python benchmarks/rollout.py --engines hf vllm --modes sync async --batch-sizes 8 32

``--samples-per-prompt n`` builds each batch as GRPO does (``size / n`` prompts, each ``n`` times in a row, seeds
differ); ``hf-noshare`` is the ``hf`` engine prefilling every row, the baseline of its shared-prompt prefill.

``--engines``: ``hf`` (core), ``vllm`` / ``vllm-bf16`` (verl-vllm; ``-bf16`` only matters on the CPU, where
float32 is the default), ``sglang`` (verl-sglang) and ``trtllm`` (verl-trtllm), both CUDA-only. The sglang and
trtllm rows have not been measured yet: no GPU machine has run this script.

Both engines load SmolLM2-135M-Instruct (``verl.models.resolve_model_path``) in the same process, get the
same left-padded prompts (the shipped GSM8K test split through ``verl.data.RLHFDataset``, chat template,
``max_prompt_length`` 256) with the training settings of the default config (temperature 0.7, top-p 1,
top-k off, 128 new tokens, rollout log-probs on, per-row ``sample_seed``), and run alternately
(rep 1: hf then vllm for every batch size, rep 2 ...), so drifts in machine load hit both alike.
tokens/s = generated response tokens (EOS included) / wall seconds of ``generate`` (prefill included).

``--modes sync async``: ``async`` rows (``hf-async``, ``vllm-async``) send the same batch through the agent-loop
manager of ``rollout.mode=async`` (``single_turn_agent``, ``rollout.agent.num_workers`` 8) against the engine's
server (``engine.server()``: one request per row, batched by the server as they arrive), with the same per-row
seeds, so both modes generate the same tokens and only the serving path differs.

Roofline (measured on this machine, not taken from a datasheet):

* memory bandwidth: best of repeated ``x.sum()`` over a 512 MiB float32 tensor (bytes read; a decode step
  only reads weights), with the ``dst.copy_(src)`` bandwidth (read + write) reported beside it;
* matmul peak: best of repeated ``torch.mm`` of 2048 x 2048 (float32 and bfloat16), ``2 n^3`` FLOPs;
* one decode step of a batch of ``bs`` reads every weight once (``P`` params x bytes, tied LM head
  included) and does ``2 P`` FLOPs per token (the standard estimate, Kaplan et al. 2020, attention over
  <= 384 positions adds < 3% here), so ``tokens/s <= bs / max(P bytes / bandwidth, bs 2 P / peak)``.

The ``fraction`` column is measured tokens/s over that bound for the engine's dtype, with the bandwidth
and matmul peak measured right before and after each ``generate`` call (``common.quick_peaks``: on a shared
virtual machine the hardware's speed drifts by 2x within a minute); the run's best machine numbers (start
and end, and again with ``--rescore``) give a second, stricter column. Each run also reports the CPU share
other processes took while it ran (``common.CpuWatch``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import MODEL, load_avg, measure_machine  # noqa: E402


def score(samples: dict[tuple[str, int], list[dict]], machine: dict, params: int) -> list[dict]:
    """Per (engine, batch): median/min/max tokens/s over reps and the fraction of the roofline.

    Each run's roofline uses the bandwidth and matmul peak measured right before and after it
    (``common.quick_peaks``); the fraction is the median over runs of tokens/s over that run's bound.
    """
    rows = []
    for (kind, bs), runs in samples.items():
        rates = [r["tokens"] / r["seconds"] for r in runs]
        half = is_bf16(kind, machine.get("device", "cpu"))
        bytes_per_param = 2 if half else 4
        fractions, bounds = [], []
        for r, rate in zip(runs, rates, strict=True):
            near = r.get("peaks") or machine
            peak = (machine["bf16_GFLOPs"] if half else near["fp32_GFLOPs"]) * 1e9
            bound = roofline(params, bytes_per_param, near["bandwidth_GBps"] * 1e9, peak, bs)
            bounds.append(bound)
            fractions.append(rate / bound)
        median = statistics.median(rates)
        best = roofline(
            params,
            bytes_per_param,
            machine["bandwidth_GBps"] * 1e9,
            machine["bf16_GFLOPs" if half else "fp32_GFLOPs"] * 1e9,
            bs,
        )
        rows.append(
            {
                "engine": kind,
                "batch": bs,
                "tokens_per_s_median": median,
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "tokens_median": statistics.median(r["tokens"] for r in runs),
                "roofline_tokens_per_s": statistics.median(bounds),
                "fraction_of_roofline": statistics.median(fractions),
                "fraction_min": min(fractions),
                "fraction_max": max(fractions),
                "fraction_of_best_roofline": median / best,
                "others_cpu_max": max(r.get("others_cpu", float("nan")) for r in runs),
                "reps": len(runs),
                "runs": runs,
            }
        )
    return rows


def rescore(path: Path) -> int:
    """Re-measure the machine, keep the best numbers, recompute the best-roofline column of a result file."""
    result = json.loads(path.read_text())
    torch.set_num_threads(int(result["threads"]))
    device = result["machine"].get("device", "cpu")
    bf16 = any(is_bf16(r["engine"], device) for r in result["rows"])
    machine = measure_machine(result["machine"], bf16=bf16, device=device)
    result["machine"].update(machine)
    samples = {(r["engine"], r["batch"]): r["runs"] for r in result["rows"]}
    result["rows"] = score(samples, result["machine"], int(result["params"]))
    result["load_avg_rescore"] = load_avg()
    path.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


ENGINES = ("hf", "hf-noshare", "vllm", "vllm-bf16", "sglang", "trtllm")
GPU_ONLY = ("sglang", "trtllm")


def is_bf16(kind: str, device: str) -> bool:
    """Whether engine ``kind`` runs in bfloat16 here: every engine on an accelerator, ``vllm-bf16`` on the CPU."""
    return device != "cpu" or kind.removesuffix("-async") == "vllm-bf16"


def roofline(params: int, bytes_per_param: int, bandwidth: float, peak: float, bs: int) -> float:
    """Upper bound on decode tokens/s for a batch of ``bs`` (see the module docstring)."""
    step = max(params * bytes_per_param / bandwidth, bs * 2 * params / peak)
    return bs / step


# ---------------------------------------------------------------------------------------------- workload
def prompt_batches(tokenizer: Any, sizes: list[int], max_prompt_length: int, samples: int = 1) -> dict[int, Any]:
    """The first ``max(sizes)`` GSM8K test prompts, tokenized as the trainer does, cut to each size; with
    ``samples`` > 1 each batch holds ``size / samples`` prompts, each ``samples`` times in a row (GRPO's n)."""
    from verl.data import RLHFDataset, collate_fn
    from verl.data.gsm8k import default_source_dir, prepare_gsm8k

    out_dir = Path(os.environ.get("VERL_BENCH_DATA", "/tmp/verl_bench_gsm8k"))
    files = prepare_gsm8k(out_dir, source_dir=default_source_dir()) if not (out_dir / "test.parquet").exists() else {}
    test = files.get("test", out_dir / "test.parquet")
    data_cfg = SimpleNamespace(max_prompt_length=max_prompt_length, filter_overlong_prompts=True)
    dataset = RLHFDataset([str(test)], tokenizer, data_cfg, max_samples=max(sizes) * 2)
    full = collate_fn([dataset[i] for i in range(max(sizes))])
    batches = {}
    for bs in sizes:
        part = full[torch.arange(bs) // samples]
        part.batch["sample_seed"] = torch.arange(bs, dtype=torch.long) + 1000
        batches[bs] = part
    return batches


def rollout_config(response_length: int, prompt_length: int, dtype: str) -> SimpleNamespace:
    return SimpleNamespace(
        n=1,
        temperature=0.7,
        top_p=1.0,
        top_k=-1,
        do_sample=True,
        prompt_length=prompt_length,
        response_length=response_length,
        calculate_log_probs=True,
        val_kwargs=SimpleNamespace(n=1, do_sample=False, temperature=0.0, top_p=1.0, top_k=-1),
        seed=0,
        dtype=dtype,
        max_num_seqs=1024,
        engine_kwargs={},
    )


def build_engine(kind: str, path: Any, tokenizer: Any, args: argparse.Namespace) -> tuple[Any, float]:
    """The engine ``kind`` on ``args.device`` with the benchmark's rollout settings; (engine, start-up seconds).

    The plugins' engines get their defaults but for vLLM's context limit (prompt + response tokens); the rollout
    section's ``max_num_seqs`` (1024) lets every engine take a whole batch at once.
    """
    start = time.perf_counter()
    device = args.device
    dtype = "bfloat16" if is_bf16(kind, device) else "float32"
    cfg = rollout_config(args.response_length, args.max_prompt_length, dtype)
    if device != "cpu":
        cfg.gpu_memory_utilization = 0.5  # the colocated trainer's share is left free, as in a hybrid run
    context = args.max_prompt_length + args.response_length
    if kind in ("hf", "hf-noshare"):
        from verl.engines.reference.rollout import HFRolloutEngine

        engine = HFRolloutEngine(path, tokenizer, cfg, device=device)
    elif kind in ("vllm", "vllm-bf16"):
        from verl_vllm.engine import VLLMRolloutEngine
        from verl_vllm.options import VLLMRolloutOptions

        options = VLLMRolloutOptions(max_model_len=context)
        engine = VLLMRolloutEngine(path, tokenizer, cfg, device=device, options=options)
    elif kind == "sglang":
        from verl_sglang.engine import SGLangRolloutEngine

        engine = SGLangRolloutEngine(path, tokenizer, cfg, device=device, options=None)
    else:
        from verl_trtllm.engine import TRTLLMRolloutEngine

        engine = TRTLLMRolloutEngine(path, tokenizer, cfg, device=device, options=None)
    return engine, time.perf_counter() - start


def agent_manager(engine: Any, tokenizer: Any, args: argparse.Namespace) -> Any:
    """The ``rollout.mode=async`` manager over ``engine.server()`` with the benchmark's sampling settings."""
    from verl.agents.manager import AgentLoopManager
    from verl.agents.single_turn import SingleTurnAgentLoop

    cfg = rollout_config(args.response_length, args.max_prompt_length, "float32")
    cfg.agent = SimpleNamespace(default_agent_loop="single_turn_agent", num_workers=8)
    return AgentLoopManager(cfg, [engine.server()], tokenizer, {"single_turn_agent": SingleTurnAgentLoop})


def hf_model(engines: dict, kind: str) -> Any:
    """The ``hf`` engine's module, whether the sync engine or only its async manager was kept."""
    if kind in engines:
        return engines[kind].model
    return engines[f"{kind}-async"].client.servers[0].engine.model


def run_once(engine: Any, batch: Any) -> dict:
    """One timed ``generate`` (or an agent-loop manager's ``generate_sequences``): seconds, response tokens, the
    CPU share of other processes, adjacent peaks."""
    from verl.protocol import DataProto

    data = DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()})
    device = str(batch.batch["input_ids"].device.type)
    before = common.quick_peaks(device)
    call = engine.generate_sequences if hasattr(engine, "generate_sequences") else engine.generate
    with common.CpuWatch() as watch:
        start = time.perf_counter()
        out = call(data)
        seconds = time.perf_counter() - start
    peaks = common.mean_peaks(before, common.quick_peaks(device))
    return {
        "seconds": seconds,
        "tokens": int(out.batch["response_mask"].sum()),
        "others_cpu": watch.others,
        "steal_cpu": watch.steal,
        "peaks": peaks,
    }


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=list(ENGINES))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (sglang and trtllm run on cuda only)")
    parser.add_argument("--modes", nargs="+", default=["sync"], choices=["sync", "async"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--response-length", type=int, default=128)
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument(
        "--samples-per-prompt",
        type=int,
        default=1,
        help="GRPO's n: each prompt this many times in a row (seeds differ)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--md", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--rescore", type=Path, default=None, help="re-measure the machine for a result file")
    args = parser.parse_args(argv)
    gpu_only = [e for e in args.engines if e in GPU_ONLY]
    if gpu_only and args.device == "cpu":
        parser.error(f"--engines {' '.join(gpu_only)} run on CUDA only: add --device cuda (on a GPU machine)")
    if args.rescore:
        return rescore(args.rescore)
    torch.set_num_threads(args.threads)
    load_start = load_avg()
    from verl.engines.reference import rollout as rollout_module
    from verl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(path)
    if any(bs % args.samples_per_prompt for bs in args.batch_sizes):
        parser.error("--batch-sizes must be multiples of --samples-per-prompt")
    batches = prompt_batches(tokenizer, args.batch_sizes, args.max_prompt_length, args.samples_per_prompt)
    batches = {bs: batch.to(args.device) for bs, batch in batches.items()}

    bf16 = any(is_bf16(kind, args.device) for kind in args.engines)
    machine = {**measure_machine(bf16=bf16, device=args.device), "device": args.device}
    engines, startup = {}, {}
    for kind in args.engines:
        engines[kind], startup[kind] = build_engine(kind, path, tokenizer, args)
        torch.set_num_threads(args.threads)
    if "async" in args.modes:
        for kind in list(engines):
            engines[f"{kind}-async"] = agent_manager(engines[kind], tokenizer, args)
        if "sync" not in args.modes:
            engines = {k: v for k, v in engines.items() if k.endswith("-async")}
    from transformers import AutoConfig

    hf_cfg = AutoConfig.from_pretrained(str(path))
    hf_kind = next((k for k in ("hf", "hf-noshare") if k in engines or f"{k}-async" in engines), None)
    params = sum(p.numel() for p in hf_model(engines, hf_kind).parameters()) if hf_kind else 134_515_008
    # warm-up (first-call allocations, vLLM's first scheduling) on the smallest batch, not timed
    for engine in engines.values():
        run_once(engine, batches[min(args.batch_sizes)])

    samples: dict[tuple[str, int], list[dict]] = {}
    for rep in range(args.reps):
        for bs in args.batch_sizes:
            for kind, engine in engines.items():
                # hf-noshare: the hf engine prefilling every row, also those repeating a prompt (the baseline of
                # the shared-prompt prefill)
                rollout_module.SHARE_PROMPT_PREFILL = kind.removesuffix("-async") != "hf-noshare"
                run = run_once(engine, batches[bs])
                samples.setdefault((kind, bs), []).append(run)
                print(
                    f"rep {rep + 1} bs {bs:3d} {kind:9s} {run['tokens']:6d} tokens {run['seconds']:7.2f} s, "
                    f"peak {run['peaks']['fp32_GFLOPs']:.0f} GFLOP/s {run['peaks']['bandwidth_GBps']:.1f} GB/s, "
                    f"other processes {common.fmt_share(run['others_cpu'])}",
                    file=sys.stderr,
                )

    machine = {**measure_machine(machine, bf16=bf16, device=args.device), "device": args.device}  # best of both
    rows = score(samples, machine, params)
    result = {
        "model": MODEL,
        "params": params,
        "layers": hf_cfg.num_hidden_layers,
        "threads": args.threads,
        "machine": {**machine, **common.machine_info()},
        "startup_s": startup,
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "settings": {
            "temperature": 0.7,
            "response_length": args.response_length,
            "max_prompt_length": args.max_prompt_length,
            "modes": args.modes,
            "samples_per_prompt": args.samples_per_prompt,
        },
        "rows": rows,
    }
    common.write_results(result, markdown(result), args.json, args.md)
    return 0


def markdown(result: dict) -> str:
    m = result["machine"]
    bf16 = "" if math.isnan(m.get("bf16_GFLOPs") or math.nan) else f" / {m['bf16_GFLOPs']:.0f} GFLOP/s bf16"
    lines = [
        f"device: {m.get('device', 'cpu')}; machine: {m.get('cpu', '?')} ({m.get('isa', '')}), {m['cores']} cores, {result['threads']} threads; best "
        f"of the run: read bandwidth {m['bandwidth_GBps']:.1f} GB/s, matmul peak {m['fp32_GFLOPs']:.0f} GFLOP/s "
        f"fp32{bf16}; load average {result['load_avg_start']} -> {result['load_avg_end']}",
        "startup: " + ", ".join(f"{k} {v:.1f} s" for k, v in result["startup_s"].items()),
        f"samples per prompt: {result['settings'].get('samples_per_prompt', 1)} (each prompt that many times in a row)",
        "",
        "| batch | engine | tokens/s (median) | min - max | response tokens | roofline tokens/s (beside each run) "
        "| fraction of roofline | min - max | fraction of the run's best roofline | other processes' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["rows"], key=lambda r: (r["batch"], r["engine"])):
        lines.append(
            f"| {r['batch']} | {r['engine']} | {r['tokens_per_s_median']:.0f} | {r['tokens_per_s_min']:.0f} - "
            f"{r['tokens_per_s_max']:.0f} | {r['tokens_median']:.0f} | {r['roofline_tokens_per_s']:.0f} | "
            f"{r['fraction_of_roofline']:.0%} | {r['fraction_min']:.0%} - {r['fraction_max']:.0%} | "
            f"{r['fraction_of_best_roofline']:.0%} | {common.fmt_share(r['others_cpu_max'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
