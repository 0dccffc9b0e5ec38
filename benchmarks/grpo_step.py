"""One GRPO training step, side by side: our ``verl train`` (``hf`` and ``vllm`` rollout) vs TRL's ``GRPOTrainer``.

    /work/venv-vllm/bin/python benchmarks/grpo_step.py --steps 4 --reps 3 --json grpo_step.json --md grpo_step.md
    python benchmarks/grpo_step.py --async --steps 4 --reps 2   # sync vs one-step off-policy (grpo_async.py)

Settings, equal on both sides (each is set explicitly, not left to a default):

* model SmolLM2-135M-Instruct in float32 on CPU (the folder ``verl.models.resolve_model_path`` gives; TRL loads
  the same folder), gradient checkpointing OFF (TRL's ``GRPOConfig`` default is ON: set to False);
* data: the first ``8 x steps`` GSM8K train prompts from our pipeline (``verl.data.gsm8k.prepare_gsm8k``: our
  instruction text), in order (no shuffling); our side reads them as a parquet file, TRL as a conversational
  ``prompt`` column with the same messages and ground truths; both apply the model's chat template with the
  generation prompt, and the TRL side checks its prompt token ids against our ``RLHFDataset``'s;
* per step 8 prompts x 4 samples = 32 completions, at most ``--max-new-tokens`` (128) new tokens, temperature
  0.7, top-p 1, top-k off; ONE optimizer step per training step (ours: ``train_batch_size=8``,
  ``ppo_mini_batch_size=8``, 1 PPO epoch; TRL: 8 completions per micro-batch x 4 accumulation steps,
  ``num_iterations=1``, ``steps_per_generation`` default = 4, so one generation per optimizer step);
* loss: clipped policy gradient, clip epsilon 0.2, token mean over all 32 completions (ours ``token-mean``,
  TRL ``loss_type="dapo"``), advantages normalised by the group std (ours ``grpo`` +
  ``norm_adv_by_std_in_grpo``, TRL ``scale_rewards="group"``), no KL (ours ``use_kl_loss=false``,
  ``use_kl_in_reward=false``; TRL ``beta=0``), no entropy bonus;
* optimizer: ``torch.optim.AdamW(params, lr=2e-5, betas=(0.9, 0.999), weight_decay=0.01, fused=True)`` (eps 1e-8), constant
  LR, no warmup, grad-norm clip 1.0; the TRL side builds that very optimizer (one param group) instead of the HF
  Trainer's default fused AdamW without decay on bias/norm weights;
* reward: our GSM8K scorer, ``method="strict"``, ``format_score=0.1`` (ours ``reward_model.reward_kwargs``;
  TRL a reward function calling ``verl.rewards.default.default_compute_score``);
* no validation, checkpoints, rollout dumps, wandb (TRL ``report_to="none"``, ``save_strategy="no"``);
* the same thread count: ``OMP_NUM_THREADS=--threads`` for every process, ``torch.set_num_threads`` on the TRL
  side (ours: torch's default, which follows ``OMP_NUM_THREADS``).

Our dynamic-batch settings are those of ``examples/gsm8k_grpo_smollm2_cpu.yaml`` (token budgets 512 for the
update and 1024 for log-probs, padding removed). The ``vllm`` side runs with ``VLLM_ENABLE_V1_MULTIPROCESSING=0
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind`` (plugins/verl-vllm/README.md).

Protocol: every run is one fresh process doing ``--steps`` steps; the first step is warm-up and not counted.
Repetitions alternate sides (rep 1: ours-hf, ours-vllm, trl; rep 2: ...), so drifts in machine load hit all
alike. Per side: median seconds per step and min-max over all counted steps of all reps, per-stage medians,
response tokens per step, start-up seconds (launch to the first step: imports, data, model / engine load;
never part of a step), peak RSS of each process and the ratios TRL/ours.

* Step time, ours: ``timing_s/step`` and its stages from the run's ``metrics.jsonl`` (gen, reward,
  old_log_prob, adv, update_actor, update_weights). TRL: ``on_step_begin`` -> ``on_step_end`` of a
  ``TrainerCallback`` (after the step's batches are fetched, until after the optimizer step); its stages are
  ``generate`` (``_generate_single_turn``: the ``model.generate`` call), ``score`` (the rest of
  ``_generate_and_score_completions``: tokenising, decoding, reward, advantages) and ``update`` (the rest of the
  step: forward + backward of 4 micro-batches, clipping, optimizer step).
* Start-up, ours: (when the step-1 line appeared in ``metrics.jsonl``, polled every 0.2 s) - launch - step-1
  time. TRL: the step-1 ``on_step_begin`` stamp - launch.
* Peak RSS: the largest of the trainer's per-phase peaks (``memory/<phase>/peak_reserved_gb``; the trainer restarts
  the kernel's high-water mark at each phase, so the exit ``ru_maxrss`` alone covers only the last one) and
  ``ru_maxrss`` from ``os.wait4`` on the child (TRL's side resets nothing: its ``ru_maxrss`` is its peak). Linux reports the largest of the child and its own
  waited-for descendants (a maximum, not a sum); ``verl train`` and the TRL side run everything in one process
  (vLLM in-process, rewards in threads), so this is the process's own peak.
* Other load: a :class:`benchmarks.common.CpuWatch` around each run gives the CPU share that processes other than
  this benchmark's took meanwhile; it is printed next to every figure.
* Machine: ``measure_machine`` (fp32 matmul peak, memory bandwidth) at the start and the end, best kept.

The TRL side runs ``benchmarks/_trl_grpo_side.py`` in its own virtual environment (``--trl-venv``; created when
missing: ``torch==<our torch>`` first, then ``trl==1.16.0`` and ``transformers==<our transformers>``, so both
sides run the same model code).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_async  # noqa: E402
from common import (  # noqa: E402
    MODEL,
    REPO,
    CpuWatch,
    fmt_share,
    load_avg,
    machine_info,
    measure_machine,
    median_spread,
    write_results,
)

SIDES = ("ours-hf", "ours-vllm", "trl")
TRL_VERSION = "1.16.0"
PROMPTS_PER_STEP = 8
SAMPLES = 4
EXAMPLE = REPO / "examples" / "gsm8k_grpo_smollm2_cpu.yaml"
TRL_SIDE = Path(__file__).resolve().parent / "_trl_grpo_side.py"
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
OUR_STAGES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")
SETTINGS = {
    "model": MODEL,
    "dtype": "float32",
    "prompts_per_step": PROMPTS_PER_STEP,
    "samples_per_prompt": SAMPLES,
    "temperature": 0.7,
    "top_p": 1.0,
    "top_k": "off",
    "lr": 2e-5,
    "lr_schedule": "constant, no warmup",
    "adamw": {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
    "grad_clip": 1.0,
    "clip_eps": 0.2,
    "kl": "off",
    "loss": "token mean over the step's 32 completions",
    "advantages": "(r - group mean) / group std",
    "optimizer_steps_per_step": 1,
    "gradient_checkpointing": False,
    "reward": "verl gsm8k scorer, method strict, format_score 0.1",
}


# ---------------------------------------------------------------------------------------------- set-up
def ensure_trl_venv(path: Path) -> Path:
    """The TRL venv's python; creates the venv when missing (our torch first, then TRL and our transformers).

    An existing venv is used as it is when ``trl`` imports there (its versions are recorded and compared with
    ours in the output); a half-built one (no ``trl``) is completed.
    """
    python = path / "bin" / "python"
    if python.exists():
        try:
            if venv_versions(python).get("trl"):
                return python
        except (subprocess.CalledProcessError, json.JSONDecodeError, OSError) as error:
            print(f"the TRL venv at {path} does not answer ({error}); completing it", file=sys.stderr)
    torch_version = metadata.version("torch").split("+")[0]
    transformers_version = metadata.version("transformers")
    print(f"creating the TRL venv at {path} (torch=={torch_version}, trl=={TRL_VERSION})", file=sys.stderr)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"torch=={torch_version}"], check=True)
    subprocess.run(
        [*pip, f"trl=={TRL_VERSION}", f"transformers=={transformers_version}", f"torch=={torch_version}"], check=True
    )
    return python


def venv_versions(python: Path) -> dict[str, str]:
    """torch / transformers / trl versions installed in the venv of ``python``."""
    code = (
        "import json, importlib.metadata as m\n"
        "def v(k):\n"
        "    try:\n        return m.version(k)\n    except m.PackageNotFoundError:\n        return None\n"
        "print(json.dumps({k: v(k) for k in ('torch', 'transformers', 'trl', 'accelerate', 'datasets')}))"
    )
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def prepare_data(work: Path, n_prompts: int, max_prompt_length: int = 256) -> dict[str, Any]:
    """Our GSM8K pipeline's first ``n_prompts`` train rows: a parquet for ours, jsonl + prompt ids for TRL.

    Rows come from ``prepare_gsm8k`` (the shipped GSM8K, our instruction text). The prompt token ids are what
    our ``RLHFDataset`` feeds the rollout (chat template with the generation prompt, no extra special tokens).

    Raises:
        RuntimeError: a prompt was filtered as too long (the two sides would then see different prompts).
    """
    from verl.data.dataset import RLHFDataset
    from verl.data.gsm8k import prepare_gsm8k, write_parquet
    from verl.data.rows import read_rows
    from verl.models import load_tokenizer, resolve_model_path

    data = work / "data"
    files = prepare_gsm8k(data / "full")
    rows = [row for row, _, _ in read_rows(files["train"])[:n_prompts]]
    parquet = data / "train_subset.parquet"
    write_parquet(rows, parquet)
    tokenizer = load_tokenizer(resolve_model_path(MODEL))
    cfg = argparse.Namespace(max_prompt_length=max_prompt_length, filter_overlong_prompts=True)
    dataset = RLHFDataset([str(parquet)], tokenizer, cfg)
    if len(dataset) != n_prompts:
        raise RuntimeError(f"{n_prompts - len(dataset)} of the first {n_prompts} prompts exceed {max_prompt_length}")
    prompt_ids = {}
    lengths = []
    for i, row in enumerate(rows):
        item = dataset[i]
        ids = item["input_ids"][item["attention_mask"].bool()].tolist()
        prompt_ids[row["prompt"][-1]["content"]] = ids
        lengths.append(len(ids))
    jsonl = data / "train_subset.jsonl"
    with open(jsonl, "w", encoding="utf-8") as fh:
        for row in rows:
            record = {"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]}
            fh.write(json.dumps({**record, "data_source": row["data_source"]}) + "\n")
    ids_file = data / "prompt_ids.json"
    ids_file.write_text(json.dumps(prompt_ids))
    return {
        "parquet": parquet,
        "jsonl": jsonl,
        "prompt_ids": ids_file,
        "n_prompts": n_prompts,
        "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths)},
    }


def our_overrides(side: str, data: dict[str, Any], args: argparse.Namespace, cwd: Path) -> list[str]:
    """``key=value`` overrides on top of the example config for one of our runs (``--async``: the ``sync`` and
    ``one-step`` sides of :mod:`grpo_async`, with the ``hf`` rollout)."""
    extra = grpo_async.side_overrides(side) if side in grpo_async.SIDES else []
    engine = "hf" if extra else side.removeprefix("ours-")
    return [
        f"data.train_files=[{data['parquet']}]",
        "data.val_files=null",
        "data.shuffle=false",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        "data.max_prompt_length=256",
        f"data.max_response_length={args.max_new_tokens}",
        f"actor_rollout_ref.model.path={MODEL}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.strategy=reference",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.2",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        # One optimizer step over the whole batch: the update's own detached log-probs are the old policy's
        # (ratio 1), as TRL does when generation and optimisation are aligned; no separate old_log_prob pass.
        "actor_rollout_ref.actor.reuse_on_policy_log_prob=true",
        "algorithm.rollout_correction.bypass_mode=false",
        "actor_rollout_ref.actor.optim.lr=2e-5",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "actor_rollout_ref.actor.optim.betas=[0.9,0.999]",
        "actor_rollout_ref.actor.optim.weight_decay=0.01",
        "actor_rollout_ref.actor.optim.clip_grad=1.0",
        f"actor_rollout_ref.rollout.name={engine}",
        f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        "actor_rollout_ref.rollout.do_sample=true",
        "actor_rollout_ref.rollout.dtype=float32",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "algorithm.use_kl_in_reward=false",
        "reward_model.reward_kwargs.method=strict",
        "reward_model.reward_kwargs.format_score=0.1",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.rollout_data_dir=null",
        "trainer.validation_data_dir=null",
        "trainer.logger=[console,file]",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={cwd / 'checkpoints'}",
        "trainer.device=cpu",
        *extra,
    ]


def child_env(args: argparse.Namespace, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a measured process: the thread count, offline hubs, no telemetry."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": str(args.threads),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------------------------------- running
def run_child(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    log: Path,
    watch_file: Path | None = None,
    on_poll: Callable[[int], None] | None = None,
) -> dict:
    """Run ``cmd`` to completion; returns wall times, exit code, peak RSS and when lines of ``watch_file`` appeared.

    The child is reaped with ``os.wait4`` for its own ``ru_maxrss``; lines appended to ``watch_file`` are
    stamped (``time.time()``) when first seen (polled every 0.2 s). ``on_poll(pid)`` is called at every poll
    while the child runs (``benchmarks/memory.py`` samples its RSS there).
    """
    seen: list[float] = []
    with open(log, "w") as out, CpuWatch() as watch:
        t_launch = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if watch_file is not None and watch_file.exists():
                with open(watch_file, encoding="utf-8") as fh:
                    complete = sum(1 for line in fh if line.endswith("\n"))
                seen.extend([time.time()] * (complete - len(seen)))
            if pid:
                break
            if on_poll is not None:
                on_poll(proc.pid)
            time.sleep(0.2)
        t_exit = time.time()
        proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "cmd": cmd,
        "returncode": proc.returncode,
        "t_launch": t_launch,
        "t_exit": t_exit,
        "wall_s": t_exit - t_launch,
        "peak_rss_GB": usage.ru_maxrss * 1024 / 1e9,
        "line_seen": seen,
        "cpu": watch.as_dict(),
        "log": str(log),
    }


def tail(path: str, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """``base`` ``key=value`` overrides with those of ``extra`` replacing the same keys in place (new keys appended)."""
    new = dict(item.split("=", 1) for item in extra)
    merged = [f"{k}={new.pop(k)}" if k in new else f"{k}={v}" for k, v in (item.split("=", 1) for item in base)]
    return merged + [f"{k}={v}" for k, v in new.items()]


def run_ours(
    side: str,
    rep: int,
    data: dict[str, Any],
    args: argparse.Namespace,
    work: Path,
    *,
    extra: list[str] | None = None,
    label: str | None = None,
    on_poll: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """One ``verl train`` process of ``--steps`` steps; per-step timings from its ``metrics.jsonl``.

    ``extra`` overrides replace the same keys of :func:`our_overrides` (``benchmarks/memory.py``'s variants);
    ``label`` names the run folder (default ``<side>-rep<rep>``); ``on_poll`` goes to :func:`run_child`.
    """
    cwd = work / (label or f"{side}-rep{rep}")
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    run_dir = cwd / "run"
    verl = Path(sys.executable).parent / "verl"
    overrides = merge_overrides(our_overrides(side, data, args, cwd), extra or [])
    cmd = [str(verl) if verl.exists() else "verl", "train", str(EXAMPLE), *overrides]
    cmd += ["--run-dir", str(run_dir)]
    env = child_env(args, VLLM_ENV if side == "ours-vllm" else None)
    run = run_child(cmd, cwd, env, cwd / "train.log", watch_file=run_dir / "metrics.jsonl", on_poll=on_poll)
    steps = []
    metrics_file = run_dir / "metrics.jsonl"
    records = [json.loads(x) for x in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    for i, rec in enumerate(records):
        rows = PROMPTS_PER_STEP * SAMPLES
        steps.append(
            {
                "step": rec["step"],
                "seconds": rec["timing_s/step"],
                "stages": {k: rec.get(f"timing_s/{k}", math.nan) for k in OUR_STAGES},
                "response_tokens": rec["response_length/mean"] * rows,
                "max_response_len": rec.get("response_length/max"),
                "score_mean": rec.get("critic/score/mean"),
                "grad_norm": rec.get("actor/grad_norm"),
                "t_logged": run["line_seen"][i] if i < len(run["line_seen"]) else math.nan,
            }
        )
    startup = steps[0]["t_logged"] - run["t_launch"] - steps[0]["seconds"] if steps else math.nan
    tail_s = run["t_exit"] - steps[-1]["t_logged"] if steps else math.nan
    resolved = run_dir / "config.yaml"
    # The trainer restarts the kernel's RSS high-water mark at every phase (CpuPlatform.reset_peak_memory_stats:
    # /proc/self/clear_refs), so the exit ru_maxrss covers the last phase only; each phase's own peak is logged as
    # memory/<phase>/peak_reserved_gb (GiB). The process's peak is the largest of them.
    phase_peaks = [
        v * 2**30 / 1e9
        for rec in records
        for k, v in rec.items()
        if k.startswith("memory/") and k.endswith("/peak_reserved_gb") and isinstance(v, int | float)
    ]
    run["ru_maxrss_GB"] = run["peak_rss_GB"]
    run["peak_rss_GB"] = max([run["peak_rss_GB"], *phase_peaks])
    return {
        "side": side,
        "rep": rep,
        **run,
        "steps": steps,
        "startup_s": startup,
        "after_last_step_s": tail_s,
        "resolved_config": resolved.read_text() if resolved.exists() else None,
    }


def run_trl(rep: int, data: dict[str, Any], args: argparse.Namespace, work: Path, python: Path) -> dict[str, Any]:
    """One TRL process of ``--steps`` steps; per-step timings from the side script's JSON."""
    from verl.models import resolve_model_path

    cwd = work / f"trl-rep{rep}"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    out = cwd / "trl_steps.json"
    cmd = [
        str(python),
        str(TRL_SIDE),
        f"--data={data['jsonl']}",
        f"--prompt-ids={data['prompt_ids']}",
        f"--model={resolve_model_path(MODEL)}",
        f"--steps={args.steps}",
        f"--prompts-per-step={PROMPTS_PER_STEP}",
        f"--samples={SAMPLES}",
        f"--max-new-tokens={args.max_new_tokens}",
        f"--threads={args.threads}",
        f"--output-dir={cwd / 'trainer_out'}",
        f"--out={out}",
    ]
    run = run_child(cmd, cwd, child_env(args), cwd / "trl.log")
    side = json.loads(out.read_text()) if out.exists() else {"steps": []}
    steps = []
    for rec in side.get("steps", []):
        if "seconds" not in rec:
            continue
        score = rec["gen_score_s"] - rec["generate_s"]
        steps.append(
            {
                "step": rec["step"],
                "seconds": rec["seconds"],
                "stages": {
                    "generate": rec["generate_s"],
                    "score": score,
                    "update": rec["seconds"] - rec["gen_score_s"],
                },
                "response_tokens": rec["response_tokens"],
                "max_response_len": rec["max_response_len"],
                "score_mean": rec.get("logged", {}).get("reward"),
                "grad_norm": rec.get("logged", {}).get("grad_norm"),
                "threads": rec.get("threads"),
                "t_begin": rec["t_begin"],
            }
        )
    startup = steps[0]["t_begin"] - run["t_launch"] if steps else math.nan
    tail_s = run["t_exit"] - side["steps"][-1].get("t_end", math.nan) if side.get("steps") else math.nan
    info = {k: v for k, v in side.items() if k != "steps"}
    return {
        "side": "trl",
        "rep": rep,
        **run,
        "steps": steps,
        "startup_s": startup,
        "after_last_step_s": tail_s,
        "trl": info,
    }


# ---------------------------------------------------------------------------------------------- summary
def summarize(runs: list[dict[str, Any]], sides: list[str]) -> list[dict[str, Any]]:
    """Per side: median / min / max step seconds over counted steps (step 1 of each run dropped) and more."""
    rows = []
    for side in sides:
        mine = [r for r in runs if r["side"] == side]
        counted = [s for r in mine for s in r["steps"][1:]]
        step_med, step_min, step_max = median_spread([s["seconds"] for s in counted])
        stage_names = list(counted[0]["stages"]) if counted else []
        stages = {k: median_spread([s["stages"][k] for s in counted])[0] for k in stage_names}
        rows.append(
            {
                "side": side,
                "runs": len(mine),
                "failed_runs": sum(1 for r in mine if r["returncode"] != 0),
                "counted_steps": len(counted),
                "step_s_median": step_med,
                "step_s_min": step_min,
                "step_s_max": step_max,
                "stages_median": stages,
                "response_tokens_median": median_spread([s["response_tokens"] for s in counted])[0],
                "startup_s_median": median_spread([r["startup_s"] for r in mine])[0],
                "peak_rss_GB_max": max((r["peak_rss_GB"] for r in mine), default=math.nan),
                "peak_rss_GB_median": median_spread([r["peak_rss_GB"] for r in mine])[0],
                "others_cpu_max": max((r["cpu"]["others_cpu"] for r in mine), default=math.nan),
                "steal_cpu_max": max((r["cpu"]["steal_cpu"] for r in mine), default=math.nan),
            }
        )
    trl = next((r for r in rows if r["side"] == "trl"), None)
    for row in rows:
        if trl is not None and row is not trl:
            row["trl_over_this_time"] = trl["step_s_median"] / row["step_s_median"]
            row["trl_over_this_rss"] = trl["peak_rss_GB_max"] / row["peak_rss_GB_max"]
            row["trl_over_this_time_by_rep"] = paired_ratios(runs, row["side"])
    return rows


def paired_ratios(runs: list[dict[str, Any]], side: str) -> list[float]:
    """Per repetition: TRL's median counted step over ``side``'s, the two runs measured back to back.

    The machine's speed drifts between repetitions (a shared virtual machine), so the spread of these
    paired ratios says more about the comparison than the spread of either side's step times.
    """
    out = []
    for rep in sorted({r["rep"] for r in runs}):
        medians = {}
        for name in (side, "trl"):
            steps = [s["seconds"] for r in runs if r["rep"] == rep and r["side"] == name for s in r["steps"][1:]]
            medians[name] = median_spread(steps)[0] if steps else math.nan
        out.append(medians["trl"] / medians[side])
    return out


def fmt(x: Any, spec: str = ".1f") -> str:
    """A number with ``spec``, ``'-'`` for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def ratio(x: Any) -> str:
    """A ratio as ``'1.23x'``, ``'-'`` for None/NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


def markdown(result: dict[str, Any]) -> str:
    """The comparison table, the stage table, every run, and what was not equal."""
    m, info = result["machine"], result["machine_info"]
    lines = [
        f"machine: {info['cpu']} ({info['isa']}), {info['cores']} cores; fp32 matmul peak "
        f"{m['fp32_GFLOPs']:.0f} GFLOP/s, read bandwidth {m['bandwidth_GBps']:.1f} GB/s; threads per process "
        f"{result['threads']} (OMP_NUM_THREADS); load average {result['load_avg_start']} -> {result['load_avg_end']}",
        f"versions: ours torch {result['versions']['ours']['torch']}, transformers "
        f"{result['versions']['ours']['transformers']}, vllm {result['versions']['ours'].get('vllm', '-')}; "
        + (
            "TRL venv " + ", ".join(f"{k} {v}" for k, v in result["versions"]["trl"].items())
            if result["versions"].get("trl")
            else "TRL not run"
        ),
        f"protocol: {result['steps']} steps per process (step 1 = warm-up, not counted), {result['reps']} reps "
        f"alternating {' / '.join(result['sides'])}; {PROMPTS_PER_STEP} prompts x {SAMPLES} samples per step, "
        f"<= {result['max_new_tokens']} new tokens; prompts {result['data']['prompt_tokens']['min']}-"
        f"{result['data']['prompt_tokens']['max']} tokens; gradient checkpointing OFF on both sides (TRL's "
        "GRPOConfig default is ON: set to False)",
        "",
        "| side | s/step median | min - max | steps | response tokens/step | start-up s | peak RSS GB | "
        "TRL time / this | per rep (paired) | TRL RSS / this | others' CPU (max over runs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['side']} | {fmt(r['step_s_median'])} | {fmt(r['step_s_min'])} - {fmt(r['step_s_max'])} | "
            f"{r['counted_steps']} | {fmt(r['response_tokens_median'], '.0f')} | {fmt(r['startup_s_median'])} | "
            f"{fmt(r['peak_rss_GB_max'], '.2f')} | {ratio(r.get('trl_over_this_time'))} | "
            f"{' '.join(ratio(x) for x in r.get('trl_over_this_time_by_rep', [])) or '-'} | "
            f"{ratio(r.get('trl_over_this_rss'))} | {fmt_share(r['others_cpu_max'])} |"
        )
    lines += [
        "",
        "TRL time / this = TRL's median s/step over this side's (> 1: this side is faster); TRL RSS / this = TRL's "
        "peak RSS over this side's (max over runs; > 1: this side needs less memory). Start-up = launch to step 1 "
        "(imports, data, model and engine load), not in any step. others' CPU = share of the machine that other "
        "processes used during the run: a figure measured while it is high is slowed by them.",
        "",
        "Per-stage medians (s). Ours: `timing_s/<stage>`; TRL: generate = `model.generate`, score = the rest of "
        "`_generate_and_score_completions` (tokenise, decode, reward, advantages), update = rest of the step "
        "(4 x forward+backward, clip, AdamW). '-' = the stage did not run: old_log_prob is skipped when the "
        "update's own detached log-probs are the old ones (TRL always here; ours with reuse_on_policy_log_prob), "
        "and TRL has no weight sync (it generates with the training module).",
        "",
        "| side | gen / generate | reward+adv / score | old_log_prob | update_actor / update | update_weights | step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        s = r["stages_median"]
        if r["side"] == "trl":
            cells = [s.get("generate"), s.get("score"), None, s.get("update"), None]
        else:
            reward_adv = (s.get("reward") or 0.0) + (s.get("adv") or 0.0) if s else None
            cells = [s.get("gen"), reward_adv, s.get("old_log_prob"), s.get("update_actor"), s.get("update_weights")]
        lines.append(f"| {r['side']} | " + " | ".join(fmt(c, ".2f") for c in cells) + f" | {fmt(r['step_s_median'])} |")
    lines += [
        "",
        "Every run (step seconds in order; * = warm-up, not counted; tokens = response tokens per step):",
        "",
        "| run | exit | steps (s) | tokens | start-up s | after last step s | peak RSS GB | others' CPU | steal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        secs = ", ".join(("*" if i == 0 else "") + f"{s['seconds']:.1f}" for i, s in enumerate(run["steps"]))
        toks = ", ".join(f"{s['response_tokens']:.0f}" for s in run["steps"])
        lines.append(
            f"| {run['side']} rep {run['rep']} | {run['returncode']} | {secs or '-'} | {toks or '-'} | "
            f"{fmt(run['startup_s'])} | {fmt(run['after_last_step_s'])} | {run['peak_rss_GB']:.2f} | "
            f"{fmt_share(run['cpu']['others_cpu'])} | {fmt_share(run['cpu']['steal_cpu'])} |"
        )
    trl_runs = [r for r in result["runs"] if r["side"] == "trl" and r.get("trl")]
    if trl_runs:
        info = trl_runs[0]["trl"]
        opt = info.get("optimizer", {})
        matched = all((r["trl"].get("checks") or {}).get("prompt_ids_match") for r in trl_runs)
        lines += [
            "",
            f"TRL side checks: prompt token ids identical to ours: {matched}; model dtype {info.get('model_dtype')}; "
            f"optimizer {opt.get('class')} ({opt.get('param_groups')} param group); gradient_checkpointing "
            f"{info.get('config', {}).get('gradient_checkpointing')}; torch threads "
            f"{sorted({s.get('threads') for r in trl_runs for s in r['steps']})}; eos ids {info.get('eos_token_ids')}.",
        ]
    lines += ["", "Not equal between the sides:", ""] + [f"- {x}" for x in result["not_equal"]]
    return "\n".join(lines)


NOT_EQUAL = [
    "weight sync: ours `update_weights` hands the new weights to the rollout engine (a no-op for `hf`, which shares "
    "the training module; a copy into vLLM's model for `vllm`); TRL generates with the training module itself.",
    "samples: sampling RNGs differ (ours seeds each row; TRL uses torch's global generator), so the responses, their "
    "lengths and the rewards differ; generation and update time scale with response length: compare the "
    "response tokens/step column.",
    "generation engine: ours-hf is our KV-cache decode loop (finished rows leave the batch), ours-vllm is vLLM in "
    "float32; TRL calls transformers `model.generate` on the padded batch of 32 (finished rows stay until all end).",
    "micro-batching of the update: ours packs sequences without padding into token budgets (512 tokens for the "
    "update, 1024 for log-probs, the example config's dynamic batch); TRL runs 4 micro-batches of 8 padded rows and "
    "computes log-probs through its fused, chunked LM head (`add_fused_lm_head`: no full logits tensor). The "
    "gradient is the same token mean either way.",
    "advantage epsilon: (r - mean) / (std + eps) with eps 1e-6 (ours, verl's) vs 1e-4 (TRL); both use the unbiased "
    "group std. Numerically different, identical in cost.",
    "module mode: TRL trains with `model.train()`, ours in eval mode; SmolLM2 has no dropout (attention_dropout 0), "
    "so the maths is the same.",
    "optimizer: TRL's default would be `adamw_torch_fused` with no weight decay on biases/norm weights (and "
    "weight_decay 0.0); the TRL side instead builds our exact `torch.optim.AdamW` (one group, decay 0.01 on all "
    "parameters, fused kernel as ours) so that the optimizer step is the same work.",
    "timing span: ours `timing_s/step` runs from generation to weight sync (the batch is collated before it, metrics "
    "after it); TRL's runs from `on_step_begin` (after the step's 4 micro-batches of the dataloader were fetched) to "
    "`on_step_end` (after the optimizer and scheduler step, before logging). Data fetching and logging are outside "
    "both.",
    "start-up includes different things: ours imports, tokenises the prompts, builds the worker (model, optimizer; "
    "vLLM engine for ours-vllm) before step 1; TRL imports, loads the model and builds the trainer.",
]


def not_equal(runs: list[dict[str, Any]], versions: dict[str, dict[str, Any]]) -> list[str]:
    """:data:`NOT_EQUAL` plus what these runs did about the old policy's log-probs, and any version mismatch."""
    extra = []
    trl_versions = versions.get("trl") or {}
    for name in ("torch", "transformers"):
        if trl_versions and trl_versions.get(name) != versions["ours"].get(name):
            extra.append(
                f"versions: {name} {versions['ours'].get(name)} on our side but {trl_versions.get(name)} in the TRL "
                "venv (not the same model code)"
            )
    for run in runs:
        checks = (run.get("trl") or {}).get("checks") or {}
        if checks and not checks.get("prompt_ids_match", True):
            extra.append(f"prompts: TRL's prompt token ids differ from ours in trl rep {run['rep']}: {checks}")
    ours = [s for r in runs if r["side"] != "trl" for s in r["steps"]]
    recomputed = [s for s in ours if not math.isnan(s["stages"].get("old_log_prob", math.nan))]
    if recomputed:
        item = (
            f"old_log_prob: ours ran a separate no-grad forward pass for the old policy's log-probs in "
            f"{len(recomputed)} of {len(ours)} steps (`timing_s/old_log_prob`, counted in our step); TRL skips it "
            "(num_iterations=1, one generation per optimizer step: it uses the update's log-probs detached)."
        )
    else:
        item = (
            "old_log_prob: neither side runs a separate old-policy forward pass: TRL because generation and "
            "optimisation are aligned (num_iterations=1), ours through `actor.reuse_on_policy_log_prob=true` (one "
            "epoch, one mini-batch): both take the update's own log-probs, detached, as the old ones (ratio 1)."
        )
    return [*extra, item, *NOT_EQUAL]


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per process (the first is warm-up)")
    parser.add_argument("--reps", type=int, default=3, help="processes per side, alternating sides")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS / torch threads of every process")
    parser.add_argument("--trl-venv", type=Path, default=Path("~/.cache/verl/bench/venv-trl"))
    parser.add_argument("--work-dir", type=Path, default=None, help="keep run folders here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")
    parser.add_argument("--md", type=Path, default=None, help="write the markdown tables here")
    parser.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="instead of the sides: the synchronous loop vs one-step off-policy (async_training.staleness_threshold"
        "=1) on a standalone rollout pool, alternating reps (benchmarks/grpo_async.py)",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is warm-up)")
    if args.async_mode:
        args.sides = list(grpo_async.SIDES)

    import torch

    torch.set_num_threads(args.threads)
    load_start = load_avg()
    python = ensure_trl_venv(args.trl_venv.expanduser()) if "trl" in args.sides else None
    versions = {"ours": {k: metadata.version(k) for k in ("torch", "transformers")}}
    with contextlib.suppress(metadata.PackageNotFoundError):
        versions["ours"]["vllm"] = metadata.version("vllm-cpu")
    if python is not None:
        versions["trl"] = venv_versions(python)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="verl_grpo_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(work, PROMPTS_PER_STEP * args.steps)
    machine = measure_machine()

    runs = []
    for rep in range(1, args.reps + 1):
        for side in args.sides:
            if side == "trl":
                run = run_trl(rep, data, args, work, python)
            else:
                run = run_ours(side, rep, data, args, work)
            runs.append(run)
            secs = " ".join(f"{s['seconds']:.1f}" for s in run["steps"])
            print(
                f"rep {rep} {side:9s} exit {run['returncode']} steps [{secs}] s, start-up {fmt(run['startup_s'])} s, "
                f"peak RSS {run['peak_rss_GB']:.2f} GB, others' CPU {fmt_share(run['cpu']['others_cpu'])}",
                file=sys.stderr,
            )
            if run["returncode"] != 0:
                print(tail(run["log"]), file=sys.stderr)

    machine = measure_machine(machine)
    result = {
        "benchmark": "grpo_step",
        "machine": machine,
        "machine_info": machine_info(),
        "threads": args.threads,
        "load_avg_start": load_start,
        "load_avg_end": load_avg(),
        "versions": versions,
        "steps": args.steps,
        "reps": args.reps,
        "sides": args.sides,
        "max_new_tokens": args.max_new_tokens,
        "settings": {**SETTINGS, "max_new_tokens": args.max_new_tokens},
        "data": {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()},
        "work_dir": str(work),
        "summary": grpo_async.summarize(runs) if args.async_mode else summarize(runs, args.sides),
        "runs": runs,
        "not_equal": [] if args.async_mode else not_equal(runs, versions),
    }
    write_results(result, grpo_async.markdown(result) if args.async_mode else markdown(result), args.json, args.md)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
