"""Rollout throughput: core's ``hf`` engine vs the ``vllm`` plugin on the same GSM8K prompts, plus the roofline.

    OMP_NUM_THREADS=2 python benchmarks/rollout.py --batch-sizes 8 32 --reps 3 --json benchmarks/rollout.json

Both engines load SmolLM2-135M-Instruct (``verl.models.resolve_model_path``) in the same process, get the
same left-padded prompts (the shipped GSM8K test split through ``verl.data.RLHFDataset``, chat template,
``max_prompt_length`` 256) with the training settings of the default config (temperature 0.7, top-p 1,
top-k off, 128 new tokens, rollout log-probs on, per-row ``sample_seed``), and run alternately
(rep 1: hf then vllm for every batch size, rep 2 ...), so drifts in machine load hit both alike.
tokens/s = generated response tokens (EOS included) / wall seconds of ``generate`` (prefill included).

Roofline (measured on this machine, not taken from a datasheet):

* memory bandwidth: best of repeated ``x.sum()`` over a 512 MiB float32 tensor (bytes read; a decode step
  only reads weights), with the ``dst.copy_(src)`` bandwidth (read + write) reported beside it;
* matmul peak: best of repeated ``torch.mm`` of 2048 x 2048 (float32 and bfloat16), ``2 n^3`` FLOPs;
* one decode step of a batch of ``bs`` reads every weight once (``P`` params x bytes, tied LM head
  included) and does ``2 P`` FLOPs per token (the standard estimate, Kaplan et al. 2020, attention over
  <= 384 positions adds < 3% here), so ``tokens/s <= bs / max(P bytes / bandwidth, bs 2 P / peak)``.

The ``fraction`` column is measured tokens/s over that bound for the engine's dtype. Machine numbers are
measured at the start and the end of the run (and again with ``--rescore``) and the best is kept: other
processes can only lower them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

MODEL = "smollm2-135m-instruct"


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------- roofline
def measure_bandwidth(mib: int = 512, reps: int = 8) -> tuple[float, float]:
    """Best read bandwidth (``x.sum()``) and copy bandwidth (``dst.copy_(src)``, read + write) in bytes/s."""
    n = mib * 2**20 // 4
    src, dst = torch.rand(n), torch.empty(n)
    dst.copy_(src)
    read = copy = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        src.sum()
        read = max(read, n * 4 / (time.perf_counter() - start))
        start = time.perf_counter()
        dst.copy_(src)
        copy = max(copy, 2 * n * 4 / (time.perf_counter() - start))
    return read, copy


def measure_matmul(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best ``torch.mm`` throughput in FLOP/s for ``n x n`` matrices of ``dtype`` (``2 n^3`` FLOPs each)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def measure_machine(previous: dict | None = None, *, bf16: bool = True) -> dict:
    """Bandwidth and matmul peaks, each the best of this measurement and ``previous``.

    Other processes on the box can only lower a measurement, so the best of several (start and end of a
    run, or a later quiet moment with ``--rescore``) is the closest to what the hardware gives.
    """
    read_bw, copy_bw = measure_bandwidth()
    now = {
        "bandwidth_GBps": read_bw / 1e9,
        "copy_bandwidth_GBps": copy_bw / 1e9,
        "fp32_GFLOPs": measure_matmul(torch.float32) / 1e9,
        # On CPUs without AVX-512 BF16 / AMX a bf16 2048^3 matmul takes about a minute: measure it only when asked.
        "bf16_GFLOPs": measure_matmul(torch.bfloat16) / 1e9 if bf16 else float("nan"),
    }
    if previous:
        now = {k: v if math.isnan(v) else max(v, float(previous.get(k, 0.0))) for k, v in now.items()}
    return now


def score(samples: dict[tuple[str, int], list[tuple[float, int]]], machine: dict, params: int) -> list[dict]:
    """Per (engine, batch): median/min/max tokens/s over reps and the fraction of the roofline."""
    rows = []
    for (kind, bs), runs in samples.items():
        rates = [tokens / seconds for seconds, tokens in runs]
        bytes_per_param = 2 if kind == "vllm-bf16" else 4
        peak = machine["bf16_GFLOPs" if kind == "vllm-bf16" else "fp32_GFLOPs"] * 1e9
        bound = roofline(params, bytes_per_param, machine["bandwidth_GBps"] * 1e9, peak, bs)
        median = statistics.median(rates)
        rows.append(
            {
                "engine": kind,
                "batch": bs,
                "tokens_per_s_median": median,
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "tokens_median": statistics.median(t for _, t in runs),
                "roofline_tokens_per_s": bound,
                "fraction_of_roofline": median / bound,
                "reps": len(runs),
                "runs": [[seconds, tokens] for seconds, tokens in runs],
            }
        )
    return rows


def rescore(path: Path) -> int:
    """Re-measure the machine, keep the best numbers, recompute the roofline columns of a result file."""
    result = json.loads(path.read_text())
    torch.set_num_threads(int(result["threads"]))
    machine = measure_machine(result["machine"])
    result["machine"].update(machine)
    samples = {(r["engine"], r["batch"]): [tuple(x) for x in r["runs"]] for r in result["rows"]}
    result["rows"] = score(samples, result["machine"], int(result["params"]))
    result["load_avg_rescore"] = load_avg()
    path.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


def roofline(params: int, bytes_per_param: int, bandwidth: float, peak: float, bs: int) -> float:
    """Upper bound on decode tokens/s for a batch of ``bs`` (see the module docstring)."""
    step = max(params * bytes_per_param / bandwidth, bs * 2 * params / peak)
    return bs / step


# ---------------------------------------------------------------------------------------------- workload
def prompt_batches(tokenizer: Any, sizes: list[int], max_prompt_length: int) -> dict[int, Any]:
    """The first ``max(sizes)`` GSM8K test prompts, tokenized as the trainer does, cut to each size."""
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
        part = full[torch.arange(bs)]
        part.batch["sample_seed"] = torch.arange(bs, dtype=torch.long) + 1000
        batches[bs] = part
    return batches


def rollout_config(response_length: int, prompt_length: int, dtype: str, vllm_options: dict) -> SimpleNamespace:
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
        engine_kwargs={"vllm": vllm_options},
    )


def build_engine(kind: str, path: Any, tokenizer: Any, args: argparse.Namespace) -> tuple[Any, float]:
    start = time.perf_counter()
    if kind == "hf":
        from verl.engines.reference.rollout import HFRolloutEngine

        cfg = rollout_config(args.response_length, args.max_prompt_length, "float32", {})
        engine = HFRolloutEngine(path, tokenizer, cfg, device="cpu")
    else:
        from verl_vllm.engine import VLLMRolloutEngine

        dtype = "bfloat16" if kind == "vllm-bf16" else "float32"
        opts = {"max_model_len": args.max_prompt_length + args.response_length, "max_num_seqs": 256}
        cfg = rollout_config(args.response_length, args.max_prompt_length, dtype, opts)
        engine = VLLMRolloutEngine(path, tokenizer, cfg, device="cpu")
    return engine, time.perf_counter() - start


def run_once(engine: Any, batch: Any) -> tuple[float, int]:
    from verl.protocol import DataProto

    data = DataProto.from_dict(tensors={k: batch.batch[k] for k in batch.batch.keys()})
    start = time.perf_counter()
    out = engine.generate(data)
    seconds = time.perf_counter() - start
    return seconds, int(out.batch["response_mask"].sum())


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm", "vllm-bf16"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--response-length", type=int, default=128)
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--rescore", type=Path, default=None, help="re-measure the machine for a result file")
    args = parser.parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    torch.set_num_threads(args.threads)
    load_start = load_avg()

    from verl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(path)
    batches = prompt_batches(tokenizer, args.batch_sizes, args.max_prompt_length)

    bf16 = "vllm-bf16" in args.engines
    machine = measure_machine(bf16=bf16)
    engines, startup = {}, {}
    for kind in args.engines:
        engines[kind], startup[kind] = build_engine(kind, path, tokenizer, args)
        torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    hf_cfg = AutoConfig.from_pretrained(str(path))
    params = sum(p.numel() for p in engines["hf"].model.parameters()) if "hf" in engines else 134_515_008
    # warm-up (first-call allocations, vLLM's first scheduling) on the smallest batch, not timed
    for engine in engines.values():
        run_once(engine, batches[min(args.batch_sizes)])

    samples: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for rep in range(args.reps):
        for bs in args.batch_sizes:
            for kind, engine in engines.items():
                seconds, tokens = run_once(engine, batches[bs])
                samples.setdefault((kind, bs), []).append((seconds, tokens))
                print(f"rep {rep + 1} bs {bs:3d} {kind:9s} {tokens:6d} tokens {seconds:7.2f} s", file=sys.stderr)

    machine = measure_machine(machine, bf16=bf16)  # again at the end: the best of both
    rows = score(samples, machine, params)
    result = {
        "model": MODEL,
        "params": params,
        "layers": hf_cfg.num_hidden_layers,
        "threads": args.threads,
        "machine": {**machine, "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "startup_s": startup,
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "settings": {
            "temperature": 0.7,
            "response_length": args.response_length,
            "max_prompt_length": args.max_prompt_length,
        },
        "rows": rows,
    }
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"machine: {m['cores']} cores, read bandwidth {m['bandwidth_GBps']:.1f} GB/s (copy "
        f"{m.get('copy_bandwidth_GBps', float('nan')):.1f}), matmul peak "
        f"{m['fp32_GFLOPs']:.0f} GFLOP/s fp32 / {m['bf16_GFLOPs']:.0f} GFLOP/s bf16; {result['threads']} threads; "
        f"load average {result['load_avg_start']} -> {result['load_avg_end']}",
        "startup: " + ", ".join(f"{k} {v:.1f} s" for k, v in result["startup_s"].items()),
        "",
        "| engine | batch | tokens/s median | min - max | tokens | roofline tokens/s | fraction |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(result["rows"], key=lambda r: (r["batch"], r["engine"])):
        lines.append(
            f"| {r['engine']} | {r['batch']} | {r['tokens_per_s_median']:.1f} | {r['tokens_per_s_min']:.1f} - "
            f"{r['tokens_per_s_max']:.1f} | {r['tokens_median']:.0f} | {r['roofline_tokens_per_s']:.0f} | "
            f"{r['fraction_of_roofline']:.0%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
