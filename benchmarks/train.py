"""Training-engine throughput: forward+backward tokens/s and MFU, with and without sequence packing.

    OMP_NUM_THREADS=2 python benchmarks/train.py --reps 3 --json benchmarks/results/train.json \
        --md benchmarks/results/train.md

Workload: a GRPO batch as the default config trains it, with real text: the first 32 GSM8K train questions
through ``verl.data.RLHFDataset`` (chat template, left-padded to ``max_prompt_length`` 256) and, as the
responses, their GSM8K reference solutions (tokenized, EOS appended, cut at 128 tokens, right-padded), so
prompt and response lengths vary as in a real rollout. Each variant runs in its own process (so that its
peak RSS is its own) on core's ``reference`` training engine with the example config's token budgets
(``ppo_max_token_len_per_gpu`` 512, ``log_prob_max_token_len_per_gpu`` 1024, dynamic micro-batches;
``--train-tokens`` / ``--infer-tokens`` change them):

* ``packed``: ``model.use_remove_padding=true`` (the default): every micro-batch is one row of real tokens;
* ``padded``: ``use_remove_padding=false``: rows padded to the micro-batch's longest prompt + response;
* ``megatron-tp1`` / ``megatron-tp2`` / ``megatron-tp3``: the ``megatron`` engine (verl-megatron:
  Megatron-core's GPTModel, local layer spec, float32, distributed optimizer) with the same settings, at
  tensor-parallel size 1 (one process) and 2 or 3 (gloo processes under ``torch.distributed.run``, each with
  its share of the threads and the same rows, as the worker's ``actor`` mesh hands them to one data-parallel replica).
  Megatron runs padded BSHD micro-batches (``use_remove_padding`` does not apply). A layout the model cannot
  take (TP=2 with SmolLM2's 9 heads) is reported as refused with the engine's config error, and the other
  variants still run. The matmul peak beside a TP > 1 pass is the sum of the ranks' peaks (each measured with its
  own threads at the same moment); tokens/s counts each token once, not once per rank.

Per repetition, each variant times ``compute_log_prob`` (forward only, no grad: the ``old_log_prob``
stage) and ``train_batch`` (forward + backward + AdamW step over the batch as one mini-batch: the
``update_actor`` stage); the first of each is a warm-up and not counted. Variants alternate
(packed, padded, packed, ...).

FLOPs, two ways:

* **MFU** (the field's convention): ``6 N T`` per training pass and ``2 N T`` per forward, with ``N`` all
  parameters (134.5 M, the tied embedding included) and ``T`` the real (non-padding) tokens, over the
  measured fp32 matmul peak (``common.measure_machine``: best ``torch.mm`` 2048^3).
* **executed FLOPs**: what the engine has to compute: the decoder layers for every real token, the LM
  head only for the positions that score a response token (the engine skips it for prompt positions), and
  causal attention (``2 x 2 x d x len^2 / 2`` per layer and sequence, forward). Backward is twice the
  forward. Padding is never counted, so a padded forward's extra work shows up as lower utilisation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

#: variant -> (engine, use_remove_padding, tensor-parallel size)
VARIANTS = {
    "packed": ("reference", True, 1),
    "padded": ("reference", False, 1),
    "megatron-tp1": ("megatron", False, 1),
    "megatron-tp2": ("megatron", False, 2),
    # SmolLM2-135M has 9 heads / 3 KV heads: TP=2 is refused (a config error naming the key); TP=3 divides them.
    "megatron-tp3": ("megatron", False, 3),
}
DEFAULT_VARIANTS = ["packed", "padded"]


# ---------------------------------------------------------------------------------------------- workload
def build_batch(tokenizer: Any, rows: int, max_prompt_length: int, response_length: int) -> Any:
    """``rows`` GSM8K train prompts (as the trainer tokenizes them) with their reference solutions as responses."""
    import torch

    from verl.data import RLHFDataset, collate_fn
    from verl.data.gsm8k import default_source_dir, prepare_gsm8k
    from verl.engines.reference.postprocess import build_rollout_batch
    from verl.protocol import DataProto

    out_dir = Path(os.environ.get("VERL_BENCH_DATA", "/tmp/verl_bench_gsm8k"))
    if not (out_dir / "train.parquet").exists():
        prepare_gsm8k(out_dir, source_dir=default_source_dir())
    cfg = SimpleNamespace(max_prompt_length=max_prompt_length, filter_overlong_prompts=True)
    dataset = RLHFDataset([str(out_dir / "train.parquet")], tokenizer, cfg, max_samples=rows * 2)
    items = [dataset[i] for i in range(rows)]
    prompts = collate_fn(items)
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    responses = torch.full((rows, response_length), pad, dtype=torch.long)
    lengths = torch.zeros(rows, dtype=torch.long)
    for i, item in enumerate(items):
        ids = tokenizer(item["extra_info"]["answer"], add_special_tokens=False)["input_ids"] + [eos]
        ids = ids[:response_length]
        responses[i, : len(ids)] = torch.tensor(ids)
        lengths[i] = len(ids)
    tensors = build_rollout_batch(
        prompts.batch["input_ids"], prompts.batch["attention_mask"], responses, lengths, pad, None
    )
    gen = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (rows, 1), generator=gen).float() * 2 - 1
    tensors["advantages"] = signs * tensors["response_mask"].float()
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 0.7})


def executed_flops(model_config: Any, seq_lens: list[int], resp_lens: list[int]) -> float:
    """Forward FLOPs the engine must compute for these sequences (see the module docstring)."""
    h = model_config.hidden_size
    layers = model_config.num_hidden_layers
    heads, kv_heads = model_config.num_attention_heads, model_config.num_key_value_heads
    head_dim = getattr(model_config, "head_dim", None) or h // heads
    inter = model_config.intermediate_size
    per_layer = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2 + 3 * h * inter  # q,o + k,v + MLP
    lm_head = h * model_config.vocab_size
    tokens = sum(seq_lens)
    attention = sum(layers * 2 * 2 * heads * head_dim * n * n / 2 for n in seq_lens)
    return 2.0 * (layers * per_layer * tokens + lm_head * sum(resp_lens)) + attention


# ---------------------------------------------------------------------------------------------- worker
def _build_engine(args: argparse.Namespace, path: Any, settings: Any, optim: Any) -> tuple[Any, int]:
    """The variant's engine and its tensor-parallel size (Megatron's process group comes from torchrun's env)."""
    engine_name, _, tp = VARIANTS[args.worker]
    if engine_name == "reference":
        from verl.engines.reference.training import ReferenceTrainingEngine

        return ReferenceTrainingEngine(path, settings, optim=optim, total_training_steps=100), 1
    from verl_megatron.engine import MegatronTrainingEngine
    from verl_megatron.options import MegatronEngineOptions

    options = MegatronEngineOptions(tensor_model_parallel_size=tp, dtype="float32")
    engine = MegatronTrainingEngine(
        path, settings, options=options, optim=optim, total_training_steps=100, device="cpu", world_size=tp
    )
    return engine, tp


def _sum_over_ranks(values: list[float], tp: int) -> list[float]:
    """Element-wise sum over the TP ranks (the machine's peak is the sum of what each rank measured)."""
    if tp == 1:
        return values
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def run_variant(args: argparse.Namespace) -> dict | None:
    """One variant in this process: warm-up, then ``--inner`` timed log-prob and training passes.

    Returns the result on rank 0, None on the other ranks of a TP=2 run.
    """
    import resource

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.config import load_config
    from verl.engines.reference.training import EngineSettings
    from verl.models import load_tokenizer, resolve_model_path
    from verl.workers.losses import make_ppo_loss

    tp = VARIANTS[args.worker][2]
    torch.set_num_threads(max(1, args.threads // tp))
    path = resolve_model_path(common.MODEL)
    tokenizer = load_tokenizer(path)
    data = build_batch(tokenizer, args.rows, args.max_prompt_length, args.response_length)
    settings = EngineSettings(
        mini_batch_size=args.rows,
        use_dynamic_bsz=True,
        max_token_len=args.train_tokens,
        infer_use_dynamic_bsz=True,
        infer_max_token_len=args.infer_tokens,
        use_remove_padding=VARIANTS[args.worker][1],
    )
    cfg = load_config(None)
    start = time.perf_counter()
    from verl.config import ConfigError

    try:
        engine, tp = _build_engine(args, path, settings, cfg.actor_rollout_ref.actor.optim)
    except ConfigError as exc:  # every rank raises the same error; rank 0 reports it
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return {"variant": args.worker, "refused": str(exc)} if rank == 0 else None
    load_s = time.perf_counter() - start
    loss_fn = make_ppo_loss(cfg.actor_rollout_ref.actor)
    logprob_s, train_s, logprob_peak, train_peak = [], [], [], []
    for i in range(args.inner + 1):
        p0 = common.quick_peaks()
        t0 = time.perf_counter()
        old = engine.compute_log_prob(data)
        t1 = time.perf_counter()
        p1 = common.quick_peaks()
        data.batch["old_log_probs"] = old.batch["old_log_probs"]
        t2 = time.perf_counter()
        engine.train_batch(data, loss_fn)
        t3 = time.perf_counter()
        p2 = common.quick_peaks()
        if i > 0:  # the first pass of each kind is warm-up
            logprob_s.append(t1 - t0)
            train_s.append(t3 - t2)
            lp, tr = _sum_over_ranks(
                [common.mean_peaks(p0, p1)["fp32_GFLOPs"], common.mean_peaks(p1, p2)["fp32_GFLOPs"]], tp
            )
            logprob_peak.append(lp)
            train_peak.append(tr)
    hf_config = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):  # N of the HF model (tied embedding once), whatever the engine's sharding
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(hf_config).parameters())
    if tp > 1 and torch.distributed.get_rank() != 0:
        return None
    mask = data.batch["attention_mask"]
    resp = data.batch["response_mask"]
    return {
        "variant": args.worker,
        "engine": VARIANTS[args.worker][0],
        "tensor_parallel_size": tp,
        "load_s": load_s,
        "logprob_s": logprob_s,
        "train_s": train_s,
        "logprob_peak_GFLOPs": logprob_peak,
        "train_peak_GFLOPs": train_peak,
        "tokens": int(mask.sum()),
        "response_tokens": int(resp.sum()),
        "padded_tokens": int(mask.numel()),
        "seq_lens": [int(x) for x in mask.sum(-1)],
        "resp_lens": [int(x) for x in resp.sum(-1)],
        "params": params,
        "config": hf_config.to_dict(),
        "threads": torch.get_num_threads() * tp,
        "peak_rss_GB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
    }


def spawn(variant: str, args: argparse.Namespace) -> tuple[dict, dict, float]:
    """Run one variant in a child process (TP > 1: a ``torch.distributed.run`` launcher and its ranks); returns
    its result, the CPU watch and the peak RSS of the largest of its processes (GB)."""
    cmd = [sys.executable, __file__, "--worker", variant, *args.passthrough]
    tp = VARIANTS[variant][2]
    if tp > 1:
        from verl.engines.weight_sync import free_port

        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={tp}"]
        cmd = [*launcher, f"--master-port={free_port()}", __file__, "--worker", variant, *args.passthrough]
    with common.CpuWatch() as watch:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"variant {variant} failed (status {status}); run {' '.join(cmd)} to see why")
    return json.loads(out.strip().splitlines()[-1]), watch.as_dict(), usage.ru_maxrss / 1e6


# ---------------------------------------------------------------------------------------------- report
def summarise(runs: dict[str, list[dict]], machine: dict) -> list[dict]:
    """Per (variant, stage): median seconds, tokens/s and utilisation against the peak measured beside each pass."""
    from transformers import LlamaConfig

    best_peak = machine["fp32_GFLOPs"] * 1e9
    rows = []
    for variant, results in runs.items():
        first = results[0]
        config = LlamaConfig(**{k: v for k, v in first["config"].items() if k != "architectures"})
        fwd = executed_flops(config, first["seq_lens"], first["resp_lens"])
        n, t = first["params"], first["tokens"]
        for stage, key, model_flops, exe_flops in (
            ("forward (old_log_prob)", "logprob", 2 * n * t, fwd),
            ("forward+backward+AdamW (update_actor)", "train", 6 * n * t, 3 * fwd),
        ):
            times = [x for r in results for x in r[f"{key}_s"]]
            peaks = [x * 1e9 for r in results for x in r[f"{key}_peak_GFLOPs"]]
            med, lo, hi = common.median_spread(times)
            mfu = [model_flops / s / p for s, p in zip(times, peaks, strict=True)]
            exe = [exe_flops / s / p for s, p in zip(times, peaks, strict=True)]
            rows.append(
                {
                    "variant": variant,
                    "stage": stage,
                    "seconds_median": med,
                    "seconds_min": lo,
                    "seconds_max": hi,
                    "tokens_per_s": t / med,
                    "mfu": common.median_spread(mfu)[0],
                    "mfu_min": min(mfu),
                    "mfu_max": max(mfu),
                    "executed_utilisation": common.median_spread(exe)[0],
                    "peak_beside_GFLOPs": common.median_spread(peaks)[0] / 1e9,
                    "mfu_vs_best_peak": model_flops / med / best_peak,
                    "others_cpu_max": max(r["_cpu"]["others_cpu"] for r in results),
                    "steal_cpu_max": max(r["_cpu"]["steal_cpu"] for r in results),
                    "peak_rss_GB": max(r["_rss_GB"] for r in results),
                    "samples": len(times),
                }
            )
    return rows


def markdown(result: dict) -> str:
    m, info = result["machine"], result["machine_info"]
    first = next(iter(result["runs"].values()))[0]
    lines = [
        f"machine: {info['cpu']} ({info['isa']}), {info['cores']} cores, {result['threads']} threads; best fp32 "
        f"matmul peak of the run {m['fp32_GFLOPs']:.0f} GFLOP/s, read bandwidth {m['bandwidth_GBps']:.1f} GB/s; load average "
        f"{result['load_avg_start']} -> {result['load_avg_end']}",
        f"batch: {result['batch_rows']} sequences, {first['tokens']} real tokens ({first['response_tokens']} response), "
        f"{first['padded_tokens']} positions before trimming; budgets {result['train_tokens']} (train) / "
        f"{result['infer_tokens']} (log-prob) tokens per micro-batch",
        "",
        "| variant | stage | seconds (median) | min - max | tokens/s | matmul peak beside it | MFU (6NT) "
        "| min - max | executed FLOP utilisation | MFU vs best peak of the run | peak RSS | other processes' CPU "
        "| steal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {r['stage']} | {r['seconds_median']:.2f} | {r['seconds_min']:.2f} - "
            f"{r['seconds_max']:.2f} | {r['tokens_per_s']:.0f} | {r['peak_beside_GFLOPs']:.0f} GFLOP/s "
            f"| {r['mfu']:.0%} | {r['mfu_min']:.0%} - {r['mfu_max']:.0%} | {r['executed_utilisation']:.0%} "
            f"| {r['mfu_vs_best_peak']:.0%} | {r['peak_rss_GB']:.1f} GB | {common.fmt_share(r['others_cpu_max'])} "
            f"| {common.fmt_share(r['steal_cpu_max'])} |"
        )
    for variant, reason in result.get("refused", {}).items():
        lines += ["", f"{variant}: not run, the engine refused the layout: " + " ".join(reason.split())]
    by = {(r["variant"], r["stage"]): r for r in result["rows"]}
    stages = sorted({r["stage"] for r in result["rows"]})
    if all(("packed", s) in by and ("padded", s) in by for s in stages):
        speedups = ", ".join(
            f"{s.split(' (')[0]} {by[('padded', s)]['seconds_median'] / by[('packed', s)]['seconds_median']:.2f}x"
            for s in stages
        )
        lines += ["", f"packing speed-up (padded / packed seconds): {speedups}"]
    for variant in ("megatron-tp1", "megatron-tp2", "megatron-tp3"):
        if all((variant, s) in by and ("packed", s) in by for s in stages):
            ratios = ", ".join(
                f"{s.split(' (')[0]} {by[(variant, s)]['seconds_median'] / by[('packed', s)]['seconds_median']:.2f}x"
                for s in stages
            )
            lines += ["", f"{variant} vs the reference engine (megatron / packed seconds): {ratios}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants",
        nargs="+",
        default=DEFAULT_VARIANTS,
        choices=list(VARIANTS),
        help="megatron-tp1 / megatron-tp2 need verl-megatron (megatron-core) installed",
    )
    parser.add_argument("--reps", type=int, default=3, help="processes per variant (alternating)")
    parser.add_argument("--inner", type=int, default=2, help="timed passes per process after the warm-up")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=128)
    parser.add_argument("--train-tokens", type=int, default=512, help="ppo_max_token_len_per_gpu")
    parser.add_argument("--infer-tokens", type=int, default=1024, help="log_prob_max_token_len_per_gpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    parser.add_argument("--worker", choices=list(VARIANTS), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = run_variant(args)
        if result is not None:
            print(json.dumps(result))
        return 0
    args.passthrough = [
        f"--inner={args.inner}",
        f"--rows={args.rows}",
        f"--max-prompt-length={args.max_prompt_length}",
        f"--response-length={args.response_length}",
        f"--train-tokens={args.train_tokens}",
        f"--infer-tokens={args.infer_tokens}",
        f"--threads={args.threads}",
    ]
    import torch

    torch.set_num_threads(args.threads)
    load_start = common.load_avg()
    machine = common.measure_machine()
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    refused: dict[str, str] = {}
    for rep in range(args.reps):
        for variant in args.variants:
            if variant in refused:
                continue
            result, cpu, rss = spawn(variant, args)
            if "refused" in result:
                refused[variant] = result["refused"]
                runs.pop(variant)
                print(f"{variant} refused: {result['refused']}", file=sys.stderr)
                continue
            result["_cpu"], result["_rss_GB"] = cpu, rss
            runs[variant].append(result)
            print(
                f"rep {rep + 1} {variant:7s} log-prob {result['logprob_s']} s, train {result['train_s']} s, "
                f"peak RSS {rss:.1f} GB, other processes {common.fmt_share(cpu['others_cpu'])}",
                file=sys.stderr,
            )
    machine = common.measure_machine(machine)
    result = {
        "machine": machine,
        "machine_info": common.machine_info(),
        "threads": args.threads,
        "batch_rows": args.rows,
        "train_tokens": args.train_tokens,
        "infer_tokens": args.infer_tokens,
        "load_avg_start": load_start,
        "load_avg_end": common.load_avg(),
        "runs": runs,
        "refused": refused,
    }
    result["rows"] = summarise(runs, machine)
    common.write_results(result, markdown(result), args.json, args.md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
