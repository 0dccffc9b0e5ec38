"""Each memory saving of our GRPO step, one at a time and combined: peak RSS and step-time cost, vs TRL.

    python benchmarks/memory.py --steps 2 --json benchmarks/results/memory.json --md benchmarks/results/memory.md
    python benchmarks/memory.py --steps 2 --variants baseline lora_r16 --skip-trl

Issue #21 (part 3): peak RSS of our GRPO step <= 1/3 of TRL's at the equal settings of ``grpo_step.py``, and
separately what each saving costs in step time. Every run here is ``grpo_step.py``'s ``ours-hf`` side (the
``hf`` rollout, the same data, sampling, loss, optimizer, threads; :func:`grpo_step.our_overrides`) with a
variant's keys on top (they replace the same keys, :func:`grpo_step.merge_overrides`):

* ``baseline``: as ``grpo_step.py`` (gradient checkpointing off, no fused kernels, full fine-tuning);
* ``grad_ckpt``: ``actor_rollout_ref.model.enable_gradient_checkpointing=true`` (recompute layer activations
  in backward);
* ``fused``: ``actor_rollout_ref.model.use_fused_kernels=true`` (``verl/engines/fused_linear.py``: the LM head and
  log-softmax in 512-token chunks, never the ``(tokens, vocab)`` logits);
* ``act_offload``: ``actor_rollout_ref.model.enable_activation_offload=true`` (``save_on_cpu`` around the training
  forwards; on the cpu device the saved tensors are already in host memory, so expect no saving);
* ``lora_r16``: ``lora_rank=16 lora_alpha=32 target_modules=all-linear`` (peft; only the adapters get grads and
  AdamW moments);
* the combinations ``grad_ckpt+fused``, ``grad_ckpt+fused+act_offload``, ``lora_r16+grad_ckpt+fused``.

TRL's side runs once, exactly as in ``grpo_step.py`` (gradient checkpointing off; its own venv).

Protocol: one fresh process per variant of ``--steps`` steps (step 1 = warm-up, not counted), in the order given.
Per run: peak RSS, median counted step seconds and the
``gen`` / ``old_log_prob`` / ``update_actor`` stage medians (``metrics.jsonl``), TRL-peak / this-peak and its
inverse, step time over the baseline's, and the CPU share other processes took (:class:`common.CpuWatch`). A run
that exits before its first step (a refused combination) is recorded with the last lines of its log instead.

Peak RSS: ``ru_maxrss`` from ``os.wait4`` (``grpo_step.py``'s figure) is NOT the lifetime peak of our process:
the trainer restarts the kernel's high-water mark at every phase (``memory/<phase>/peak_*`` metrics,
``verl/workers/switching.py`` -> ``CpuPlatform.reset_peak_memory_stats``: ``5`` into ``/proc/self/clear_refs``),
and the exit ``ru_maxrss`` is that mark, so it only covers the last phase (measured: 3.09 GB ru_maxrss vs 4.24 GB
inside the update). The peak reported here is the largest of ``ru_maxrss``, every sampled ``VmHWM`` and the
trainer's own ``memory/<phase>/peak_reserved_gb`` (GiB, the same VmHWM read at each phase end); ``ru_maxrss`` is
kept beside it. TRL's process resets nothing, so its ``ru_maxrss`` is its peak.

RSS timeline: the parent reads ``VmRSS`` and ``VmHWM`` from ``/proc/<pid>/status`` every 0.2 s. Per counted
step the generation window is ``[end - step, end - step + gen]`` and the update window ends ``update_weights``
before the step's end and lasts ``update_actor``, where ``end`` is when the step's ``metrics.jsonl`` line was
seen (late by the metrics/logging time and up to one poll, so the windows are blurred by about 0.5 s). The peak
in a window is the largest VmRSS sampled in it, or the new VmHWM if the high-water mark rose inside it (which
catches spikes shorter than a poll).

Analytic floor: the RSS of a bare process that imports torch and transformers and loads the model in float32
(measured in a child, ``ru_maxrss``, after reading every weight once: transformers maps an fp32 safetensors
file into memory and its pages count only once touched; so it holds the 4 bytes of every parameter) plus 12
bytes (fp32 gradient and AdamW's two moments) per trained parameter, plus 4 bytes per new adapter parameter for
LoRA. Parameter counts come
from the model config on the meta device (tied weights once; LoRA through
:func:`verl.engines.lora.adapter_param_count`, as ``scripts/lora_memory.py``). Nothing else (activations, the KV
cache, the batch) is in it: it is what any AdamW step of this model needs.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_step  # noqa: E402
from common import MODEL, fmt_share, load_avg, machine_info, median_spread, write_results  # noqa: E402

M = "actor_rollout_ref.model"
GRAD_CKPT = [f"{M}.enable_gradient_checkpointing=true"]
FUSED = [f"{M}.use_fused_kernels=true"]
OFFLOAD = [f"{M}.enable_activation_offload=true"]
LORA_RANK = 16
LORA = [f"{M}.lora_rank={LORA_RANK}", f"{M}.lora_alpha={2 * LORA_RANK}", f"{M}.target_modules=all-linear"]
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "grad_ckpt": GRAD_CKPT,
    "fused": FUSED,
    "grad_ckpt+fused": GRAD_CKPT + FUSED,
    "act_offload": OFFLOAD,
    "grad_ckpt+fused+act_offload": GRAD_CKPT + FUSED + OFFLOAD,
    "lora_r16": LORA,
    "lora_r16+grad_ckpt+fused": LORA + GRAD_CKPT + FUSED,
}
TARGET = 1 / 3  # issue #21: our peak RSS <= 1/3 of TRL's
GB = 1e9
GIB = 1 << 30
BARE_CODE = (
    "import sys, torch, transformers\n"
    "torch.set_num_threads(int(sys.argv[2]))\n"
    "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)\n"
    # fp32 safetensors load as a memory map: pages are resident only once read; read every weight, as a step does.
    "print(sum(float(p.detach().sum()) for p in m.parameters()))\n"
)


# ---------------------------------------------------------------------------------------------- pure helpers
def floor_bytes(bare_bytes: float, trained: int, new_params: int = 0) -> float:
    """Analytic floor of one fp32 AdamW step: the bare loaded process + grads and 2 moments + new parameters.

    Args:
        bare_bytes: RSS of a process with torch/transformers imported and the model loaded (bytes; it holds
            every base parameter once).
        trained: parameters that get a gradient and AdamW state (all for full fine-tuning, the adapters for LoRA).
        new_params: parameters that are not in the loaded model (LoRA adapters), 4 bytes each.

    Returns:
        bytes: ``bare_bytes + 12 * trained + 4 * new_params``.

    Raises:
        ValueError: a negative count.
    """
    if trained < 0 or new_params < 0:
        raise ValueError(f"parameter counts must be >= 0, got trained={trained}, new_params={new_params}")
    return bare_bytes + 12 * trained + 4 * new_params


def rss_in_window(samples: list[tuple[float, int, int]], t0: float, t1: float) -> float:
    """Peak RSS (bytes) in ``[t0, t1]`` from ``(time s, VmRSS bytes, VmHWM bytes)`` samples in time order.

    The largest VmRSS sampled inside, or the high-water mark at the window's last sample when it rose above
    the one before the window (a spike between two polls). NaN when no sample falls inside.
    """
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return math.nan
    before = [s[2] for s in samples if s[0] < t0]
    peak = max(s[1] for s in inside)
    hwm_start = before[-1] if before else 0
    if inside[-1][2] > hwm_start:
        peak = max(peak, inside[-1][2])
    return float(peak)


def step_windows(step: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """``{"gen": (t0, t1), "update": (t0, t1)}`` of one of our steps from its stage seconds and log time."""
    end, total = step["t_logged"], step["seconds"]
    st = {k: (0.0 if v is None or math.isnan(v) else v) for k, v in step["stages"].items()}
    start = end - total
    update_end = end - st.get("update_weights", 0.0)
    return {
        "gen": (start, start + st.get("gen", 0.0)),
        "update": (update_end - st.get("update_actor", 0.0), update_end),
    }


def refusal_text(log_text: str, lines: int = 3) -> str:
    """The last ``lines`` non-empty lines of a failed run's log, joined (its error, for the table)."""
    kept = [x.strip() for x in log_text.splitlines() if x.strip()]
    return " / ".join(kept[-lines:])


class RssSampler:
    """``on_poll`` callback for :func:`grpo_step.run_child`: appends ``(time, VmRSS, VmHWM)`` in bytes."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []

    def __call__(self, pid: int) -> None:
        import time

        fields = {}
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
                for line in fh:
                    if line.startswith(("VmRSS:", "VmHWM:")):
                        key, value = line.split(":", 1)
                        fields[key] = int(value.split()[0]) * 1024
        except OSError:  # the child exited between the poll and the read
            return
        if len(fields) == 2:
            self.samples.append((time.time(), fields["VmRSS"], fields["VmHWM"]))


# ---------------------------------------------------------------------------------------------- measuring
def param_counts(model: str, lora_rank: int) -> dict[str, int]:
    """``{"base": all parameters, "adapter": LoRA adapter parameters (0 without LoRA)}`` from the model config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl.engines.lora import LoraSettings, adapter_param_count
    from verl.models import resolve_model_path

    config = AutoConfig.from_pretrained(str(resolve_model_path(model)))
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    if lora_rank == 0:
        return {"base": sum(p.numel() for p in {id(p): p for p in built.parameters()}.values()), "adapter": 0}
    return adapter_param_count(built, LoraSettings(rank=lora_rank, alpha=2 * lora_rank, target_modules="all-linear"))


def measure_bare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Peak RSS of a child that imports torch + transformers and loads the model in float32 (nothing else)."""
    from verl.models import resolve_model_path

    cwd = work / "bare"
    cwd.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", BARE_CODE, str(resolve_model_path(MODEL)), str(args.threads)]
    run = grpo_step.run_child(cmd, cwd, grpo_step.child_env(args), cwd / "bare.log")
    if run["returncode"] != 0:
        raise RuntimeError(f"the bare model-load child failed: {grpo_step.tail(run['log'])}")
    return {"peak_rss_GB": run["peak_rss_GB"], "wall_s": run["wall_s"], "cpu": run["cpu"]}


def phase_peaks_GB(metrics_file: Path) -> list[dict[str, float]]:
    """Per logged step, the trainer's ``memory/<phase>/peak_reserved_gb`` (GiB) as GB: ``{phase: GB}``."""
    if not metrics_file.exists():
        return []
    out = []
    for line in metrics_file.read_text().splitlines():
        rec = json.loads(line)
        out.append(
            {
                k.split("/")[1]: v * GIB / GB
                for k, v in rec.items()
                if k.startswith("memory/") and k.endswith("/peak_reserved_gb")
            }
        )
    return out


def run_variant(name: str, data: dict[str, Any], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One ``verl train`` process of variant ``name`` with the RSS timeline; stage-window peaks per counted step.

    ``peak_rss_GB`` is the true peak (see the module docstring), ``ru_maxrss_GB`` what ``os.wait4`` reported.
    """
    sampler = RssSampler()
    run = grpo_step.run_ours("ours-hf", 1, data, args, work, extra=VARIANTS[name], label=name, on_poll=sampler)
    run["variant"] = name
    run["overrides"] = VARIANTS[name]
    run["rss_timeline"] = sampler.samples
    run["timeline_max_GB"] = max((s[1] for s in sampler.samples), default=math.nan) / GB
    phases = phase_peaks_GB(work / name / "run" / "metrics.jsonl")
    # run_ours already took the largest of ru_maxrss (kept as ru_maxrss_GB) and the trainer's phase peaks.
    candidates = [run["peak_rss_GB"], *(s[2] / GB for s in sampler.samples), *(v for p in phases for v in p.values())]
    run["peak_rss_GB"] = max(candidates)
    for step, phase in zip(run["steps"], phases, strict=False):
        step["phase_peak_GB"] = phase
    for step in run["steps"]:
        if math.isnan(step.get("t_logged", math.nan)):
            continue
        step["window_peak_GB"] = {
            k: rss_in_window(sampler.samples, t0, t1) / GB for k, (t0, t1) in step_windows(step).items()
        }
    run["refusal"] = None
    if not run["steps"] and run["returncode"] != 0:
        run["refusal"] = refusal_text(Path(run["log"]).read_text(errors="replace"))
    return run


def summarize(runs: list[dict[str, Any]], trl: dict[str, Any] | None, floors: dict[str, float]) -> list[dict[str, Any]]:
    """Per variant: peak, ratios to TRL, floor, counted-step medians, cost vs the baseline, window peaks."""
    trl_peak = trl["peak_rss_GB"] if trl and trl["returncode"] == 0 else math.nan
    rows = []
    for run in runs:
        counted = run["steps"][1:]
        stages = {
            k: median_spread([s["stages"][k] for s in counted if not math.isnan(s["stages"][k])])[0]
            for k in ("gen", "old_log_prob", "update_actor")
        }
        windows = {
            k: max((s["window_peak_GB"][k] for s in counted if "window_peak_GB" in s), default=math.nan)
            for k in ("gen", "update")
        }
        peak = run["peak_rss_GB"] if run["steps"] else math.nan
        phase = {
            k: max((s.get("phase_peak_GB", {}).get(k, math.nan) for s in counted), default=math.nan)
            for k in ("gen", "train")
        }
        floor = floors["lora" if run["variant"].startswith("lora") else "full"]
        rows.append(
            {
                "variant": run["variant"],
                "returncode": run["returncode"],
                "refusal": run["refusal"],
                "counted_steps": len(counted),
                "peak_rss_GB": peak,
                "ru_maxrss_GB": run["ru_maxrss_GB"],
                "phase_peak_GB": phase,
                "this_over_trl": peak / trl_peak,
                "trl_over_this": trl_peak / peak,
                "floor_GB": floor,
                "peak_over_floor": peak / floor,
                "step_s_median": median_spread([s["seconds"] for s in counted])[0],
                "stages_median": stages,
                "window_peak_GB": windows,
                "others_cpu": run["cpu"]["others_cpu"],
            }
        )
    base = next((r for r in rows if r["variant"] == "baseline"), None)
    for row in rows:
        row["step_over_baseline"] = row["step_s_median"] / base["step_s_median"] if base else math.nan
    return rows


# ---------------------------------------------------------------------------------------------- report
def fmt(x: Any, spec: str = ".2f") -> str:
    """A number with ``spec``; ``'-'`` for None / NaN."""
    return grpo_step.fmt(x, spec)


def verdict(rows: list[dict[str, Any]], trl_peak: float) -> str:
    """One sentence: which variants reach <= 1/3 of TRL's peak, or how close the best one and its floor come."""
    if math.isnan(trl_peak):
        return "TRL was not run (or failed): no ratio to the <= 1/3 target."
    measured = [r for r in rows if not math.isnan(r["peak_rss_GB"])]
    if not measured:
        return "No variant finished a step."
    met = [r["variant"] for r in measured if r["this_over_trl"] <= TARGET]
    best = min(measured, key=lambda r: r["peak_rss_GB"])
    target_gb = TARGET * trl_peak
    head = (
        f"Meets <= 1/3 of TRL's {trl_peak:.2f} GB (<= {target_gb:.2f} GB): {', '.join(met)}."
        if met
        else f"No variant meets <= 1/3 of TRL's {trl_peak:.2f} GB (<= {target_gb:.2f} GB)."
    )
    tail = (
        f" Lowest: {best['variant']} at {best['peak_rss_GB']:.2f} GB ({best['this_over_trl']:.2f} of TRL), its "
        f"analytic floor {best['floor_GB']:.2f} GB"
    )
    full = next((r["floor_GB"] for r in measured if not r["variant"].startswith("lora")), math.nan)
    if not math.isnan(full):
        tail += f"; the full fine-tuning floor is {full:.2f} GB ({full / trl_peak:.2f} of TRL)"
    return head + tail + "."


def markdown(result: dict[str, Any]) -> str:
    """The variant table, the floor, the verdict, and every run's step seconds."""
    info, bare, counts = result["machine_info"], result["bare"], result["params"]
    trl = result.get("trl")
    trl_peak = trl["peak_rss_GB"] if trl and trl["returncode"] == 0 else math.nan
    lines = [
        f"machine: {info['cpu']} ({info['isa']}), {info['cores']} cores; threads per process {result['threads']}; "
        f"load average {result['load_avg_start']} -> {result['load_avg_end']}",
        f"versions: torch {result['versions']['torch']}, transformers {result['versions']['transformers']}, "
        f"peft {result['versions'].get('peft', '-')}",
        f"protocol: grpo_step.py's ours-hf settings ({grpo_step.PROMPTS_PER_STEP} prompts x {grpo_step.SAMPLES} "
        f"samples, <= {result['max_new_tokens']} new tokens, fp32 AdamW, gradient checkpointing off unless the "
        f"variant sets it); one fresh process of {result['steps']} steps per variant (step 1 = warm-up, not "
        "counted); TRL once, as in grpo_step.py",
        "",
        f"TRL peak RSS: {fmt(trl_peak)} GB"
        + (f" (exit {trl['returncode']}, others' CPU {fmt_share(trl['cpu']['others_cpu'])})" if trl else " (not run)"),
        "",
        "| variant | peak RSS GB | this / TRL | TRL / this | floor GB | peak / floor | s/step | vs baseline | gen s | "
        "old_log_prob s | update_actor s | peak in gen GB | peak in update GB | trainer gen / train peak GB | "
        "others' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        if r["refusal"] is not None:
            # A config refusal or a crash before step 1: the error's last log lines instead of numbers.
            lines.append(f"| {r['variant']} | no step (exit {r['returncode']}): {r['refusal']} |" + " |" * 13)
            continue
        s, w = r["stages_median"], r["window_peak_GB"]
        name = r["variant"] + (f" (exit {r['returncode']})" if r["returncode"] != 0 else "")
        lines.append(
            f"| {name} | {fmt(r['peak_rss_GB'])} | {fmt(r['this_over_trl'])} | {fmt(r['trl_over_this'])} | "
            f"{fmt(r['floor_GB'])} | {fmt(r['peak_over_floor'])} | {fmt(r['step_s_median'], '.1f')} | "
            f"{grpo_step.ratio(r['step_over_baseline'])} | {fmt(s['gen'], '.1f')} | {fmt(s['old_log_prob'], '.1f')} | "
            f"{fmt(s['update_actor'], '.1f')} | {fmt(w['gen'])} | {fmt(w['update'])} | "
            f"{fmt(r['phase_peak_GB']['gen'])} / {fmt(r['phase_peak_GB']['train'])} | {fmt_share(r['others_cpu'])} |"
        )
    lines += [
        "",
        verdict(result["summary"], trl_peak),
        "",
        f"Floor = bare process {bare['peak_rss_GB']:.2f} GB (torch + transformers imported, the model loaded in "
        f"float32: {counts['full']['base']:,} parameters, {counts['full']['base'] * 4 / GB:.2f} GB of them) + 12 B "
        f"(fp32 grad + 2 AdamW moments) per trained parameter + 4 B per adapter parameter: full fine-tuning "
        f"{result['floors']['full']:.2f} GB; LoRA r={LORA_RANK} ({counts['lora']['adapter']:,} adapter parameters) "
        f"{result['floors']['lora']:.2f} GB. vs baseline = s/step over the baseline's (> 1: the saving costs time). "
        "Peak in gen / update = the RSS timeline's peak inside those stage windows of the counted steps (see the "
        "docstring; '-' = no sample); trainer gen / train peak = its own `memory/gen|train/peak_reserved_gb` "
        "(VmHWM at each phase end, converted from GiB). Peak RSS = the largest of ru_maxrss, every sampled VmHWM and "
        "those: the trainer restarts VmHWM at each phase, so ru_maxrss alone covers only the last phase. "
        "others' CPU = the machine share other processes took during the run.",
        "",
        "| run | exit | steps (s; * = warm-up) | peak RSS GB | ru_maxrss GB | timeline max VmRSS GB | overrides |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        secs = ", ".join(("*" if i == 0 else "") + f"{s['seconds']:.1f}" for i, s in enumerate(run["steps"]))
        lines.append(
            f"| {run['variant']} | {run['returncode']} | {secs or '-'} | {run['peak_rss_GB']:.2f} | "
            f"{run['ru_maxrss_GB']:.2f} | "
            f"{fmt(run['timeline_max_GB'])} | {' '.join(run['overrides']) or '-'} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="steps per process (the first is warm-up)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--skip-trl", action="store_true", help="do not run TRL's side (no ratios)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS / torch threads of every process")
    parser.add_argument("--trl-venv", type=Path, default=Path("~/.cache/verl/bench/venv-trl"))
    parser.add_argument("--work-dir", type=Path, default=None, help="keep run folders here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--md", type=Path, default=None, help="write the markdown tables here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is warm-up)")

    import torch

    torch.set_num_threads(args.threads)
    load_start = load_avg()
    python = None if args.skip_trl else grpo_step.ensure_trl_venv(args.trl_venv.expanduser())
    versions = {k: metadata.version(k) for k in ("torch", "transformers", "peft")}
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="verl_memory_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    data = grpo_step.prepare_data(work, grpo_step.PROMPTS_PER_STEP * args.steps)
    counts = {"full": param_counts(MODEL, 0), "lora": param_counts(MODEL, LORA_RANK)}
    bare = measure_bare(args, work)
    bare_bytes = bare["peak_rss_GB"] * GB
    floors = {
        "full": floor_bytes(bare_bytes, counts["full"]["base"]) / GB,
        "lora": floor_bytes(bare_bytes, counts["lora"]["adapter"], counts["lora"]["adapter"]) / GB,
    }
    print(f"bare process {bare['peak_rss_GB']:.2f} GB; floors {floors}", file=sys.stderr)

    runs = []
    for name in args.variants:
        run = run_variant(name, data, args, work)
        runs.append(run)
        secs = " ".join(f"{s['seconds']:.1f}" for s in run["steps"])
        print(
            f"{name:28s} exit {run['returncode']} steps [{secs}] s, peak RSS {run['peak_rss_GB']:.2f} GB, "
            f"others' CPU {fmt_share(run['cpu']['others_cpu'])}",
            file=sys.stderr,
        )
        if run["returncode"] != 0:
            print(grpo_step.tail(run["log"]), file=sys.stderr)
    trl = None
    if python is not None:
        trl = grpo_step.run_trl(1, data, args, work, python)
        print(f"trl exit {trl['returncode']}, peak RSS {trl['peak_rss_GB']:.2f} GB", file=sys.stderr)
        versions["trl_venv"] = grpo_step.venv_versions(python)

    result = {
        "benchmark": "memory",
        "machine_info": machine_info(),
        "threads": args.threads,
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "versions": versions,
        "steps": args.steps,
        "max_new_tokens": args.max_new_tokens,
        "data": {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()},
        "params": counts,
        "bare": bare,
        "floors": floors,
        "summary": summarize(runs, trl, floors),
        "runs": runs,
        "trl": trl,
        "work_dir": str(work),
    }
    write_results(result, markdown(result), args.json, args.md)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    ok = all(r["returncode"] == 0 or r["refusal"] is not None for r in runs)
    return 0 if ok and (trl is None or trl["returncode"] == 0) else 1


if __name__ == "__main__":
    raise SystemExit(main())
